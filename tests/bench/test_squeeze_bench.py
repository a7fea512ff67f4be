"""bench/squeeze.py at its smallest size: both methods time their layers and agree on the singular values."""


def test_squeeze_and_naive_agree_and_the_ratio_is_printed(run_bench, figure):
    out = run_bench("-m", "bench.squeeze", "--layers", "2", "--dim", "128", "--rank", "8", "--naive-layers", "1",
                    "--threads", "1")
    figure(r"naive / squeeze = ([0-9.]+)×", out)
    assert figure(r"agree to ([0-9.e+-]+) \(max relative error\)", out) < 1e-4
