from kfp_finetune.components._shared.torchtune.seq_len import cut_length, fits
from kfp_finetune.components._shared.unfit_rows import too_many_unfit


def test_a_prompt_fits_when_one_trained_token_and_the_eos_follow_it():
    assert fits(254, 256) and not fits(255, 256)


def test_unfit_rows_are_refused_beyond_one_row_and_one_percent():
    assert not too_many_unfit(1, 60) and too_many_unfit(2, 60)
    assert not too_many_unfit(10, 1000) and "more than 1% of the rows" in too_many_unfit(11, 1000)


def test_the_tokenizer_length_without_packs():
    assert cut_length([100] * 99 + [5000], 2048) == 256  # the packs' rule
    assert cut_length(None, 2048) == 2048  # lengths unknown: the model's limit, never past it
    assert cut_length(None, None) is None
