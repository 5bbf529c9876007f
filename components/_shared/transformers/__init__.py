"""The transformers engine's wing (issue 28): supervised fine-tuning with Transformers + TRL's SFTTrainer + PEFT,
for models torchtune cannot serve (mixture-of-experts such as Qwen3-MoE, Gemma 3 multimodal, ...).

settings.py holds the typed settings and builds TRL's and PEFT's configs without loading a model (the early
validation); train.py runs the fine-tune (under torchrun on a TrainJob node); run_layout.py names and reads the
run folder it writes; face.py is what the steps above the wings may ask of such a run. Module imports need no
torch: TRL, transformers and PEFT are imported inside the functions that use them.
"""
