import pytest

from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len, percentile, sample_indices


def test_p99_rounded_up_to_256_and_capped_by_the_model():
    lengths = [100] * 980 + [700] * 19 + [50_000]  # one outlier in 1000 does not set the length
    assert percentile(lengths) == 700
    assert choose_max_seq_len(lengths, 8192) == 768
    assert choose_max_seq_len(lengths, 512) == 512
    assert choose_max_seq_len([256], None) == 256 and choose_max_seq_len([257], None) == 512


def test_one_outlier_never_sets_the_length_of_a_small_dataset():
    """Nearest rank would make the 99th percentile of 60 rows their longest: one 100k-character row would set
    the length of every pack. The rule never takes the single longest row."""
    lengths = [40] * 59 + [100_015]
    assert percentile(lengths) == 40 and choose_max_seq_len(lengths, 131072) == 256
    assert percentile([40, 100_015]) == 40 and percentile([300]) == 300
    assert percentile(lengths, 100) == 100_015  # the maximum stays the maximum
    # Two such rows are data, not an outlier: the length holds them (up to the model's limit).
    assert choose_max_seq_len([40] * 58 + [3000, 3000], 131072) == 3072


def test_no_lengths_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        percentile([])


def test_the_fix_never_asks_for_more_than_the_model_holds():
    from kfp_finetune.components._shared.torchtune.seq_len import unfit_message

    named = ["train.jsonl line 31"]
    fits_model = unfit_message(1, 61, 256, 1500, named, "", 2048)
    assert "train.jsonl line 31" in fits_model and "set tune_max_seq_len to at least 1500" in fits_model
    too_long = unfit_message(1, 61, 256, 66691, named, "", 2048)
    assert "set tune_max_seq_len" not in too_long and "more than the model's 2048" in too_long
    refused = unfit_message(3, 61, 256, 1500, named, "more than 1% of the rows")
    assert "That is more than 1% of the rows. Fix: set tune_max_seq_len" in refused and "line 31 …" in refused


def test_the_sample_is_the_same_on_every_draw_and_every_row_where_there_are_few():
    assert sample_indices(10) == list(range(10))
    drawn = sample_indices(100_000)
    assert drawn == sample_indices(100_000) and len(drawn) == 2000 and drawn == sorted(set(drawn))
