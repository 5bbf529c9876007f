import pytest

from kfp_finetune.components._shared.seq_len import choose_max_seq_len, percentile


def test_p99_rounded_up_to_256_and_capped_by_the_model():
    lengths = [100] * 980 + [700] * 19 + [50_000]  # one outlier in 1000 does not set the length
    assert percentile(lengths) == 700
    assert choose_max_seq_len(lengths, 8192) == 768
    assert choose_max_seq_len(lengths, 512) == 512
    assert choose_max_seq_len([256], None) == 256 and choose_max_seq_len([257], None) == 512


def test_the_longest_masked_prompt_keeps_a_trained_token():
    lengths = [100] * 980 + [700] * 19 + [50_000]  # p99 700 -> 768
    assert choose_max_seq_len(lengths, 8192, longest_prompt=0) == 768  # unknown: the p99 rule alone
    assert choose_max_seq_len(lengths, 8192, longest_prompt=300) == 768  # the p99 length already holds it
    assert choose_max_seq_len(lengths, 8192, longest_prompt=766) == 768  # prompt + 1 trained token + EOS
    # One more prompt token (or a prompt of exactly the p99-rounded length) would keep no trained token.
    assert choose_max_seq_len(lengths, 8192, longest_prompt=767) == 1024
    assert choose_max_seq_len(lengths, 8192, longest_prompt=768) == 1024
    assert choose_max_seq_len(lengths, 8192, longest_prompt=3000) == 3072
    # The model's limit still wins: when even it cannot hold the prompt, prompt_fit refuses the run.
    assert choose_max_seq_len(lengths, 1024, longest_prompt=1023) == 1024
    assert choose_max_seq_len(lengths, 1024, longest_prompt=5000) == 1024


def test_no_lengths_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        percentile([])
