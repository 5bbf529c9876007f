"""kfp-finetune benchmarks: reproducible measurements on this kind of machine (not tests).

Run all of them with `make bench` or `python -m benchmarks.run --help`; results are written as JSON + markdown.
"""
