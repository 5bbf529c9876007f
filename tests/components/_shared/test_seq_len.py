import pytest

from kfp_finetune.components._shared.seq_len import choose_max_seq_len, percentile


def test_p99_rounded_up_to_256_and_capped_by_the_model():
    lengths = [100] * 980 + [700] * 19 + [50_000]  # one outlier in 1000 does not set the length
    assert percentile(lengths) == 700
    assert choose_max_seq_len(lengths, 8192) == 768
    assert choose_max_seq_len(lengths, 512) == 512
    assert choose_max_seq_len([256], None) == 256 and choose_max_seq_len([257], None) == 512


def test_no_lengths_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        percentile([])
