"""bench.kernel_gaps on a hand-made trace: idle stretches between device operations, the longest first,
host-bound when the next operation was launched after the GPU ran dry."""

from bench.kernel_gaps import gaps, summary


def device(cat, name, ts, dur, correlation):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": {"correlation": correlation}}


def launch(cat, ts, correlation, tid=1):
    return {"ph": "X", "cat": cat, "name": "cudaLaunchKernel", "ts": ts, "dur": 3, "pid": 9, "tid": tid,
            "args": {"correlation": correlation}}


def host_op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 9, "tid": tid}


TRACE = [
    device("kernel", "gemm", 0, 10, 1), launch("cuda_runtime", -5, 1),
    # ran dry at 10; the next kernel launched at 25 from inside aten::mm: 15 of its 20 us idle are the host's
    device("kernel", "triton_fused", 30, 5, 2), launch("cuda_driver", 25, 2),
    device("kernel", "attention", 36, 4, 3), launch("cuda_runtime", 26, 3),  # 1 us: the GPU's own launch latency
    # ran dry at 40; the memset was launched before it (at 31): the device waited on its own
    device("gpu_memset", "Memset (Unknown)", 60, 1, 4), launch("cuda_runtime", 31, 4),
    device("kernel", "tiny", 61.5, 1, 5), launch("cuda_runtime", 28, 5),  # 0.5 us: below min_us
    host_op("encoder", 0, 100), host_op("aten::mm", 20, 10), host_op("aten::mm", 24, 3, tid=2),  # another thread
]


def test_gaps_longest_first_with_who_waited():
    found = gaps(TRACE)
    assert [(g.idle_us, g.after, g.before) for g in found] == [
        (20, "gemm", "triton_fused"), (20, "attention", "Memset (Unknown)"), (1, "triton_fused", "attention")]
    launched_late = {g.before: g for g in found}
    assert launched_late["triton_fused"].launched_late_us == 15 and launched_late["triton_fused"].host_bound
    assert launched_late["triton_fused"].host_op == "aten::mm"  # the innermost op of the launching thread
    assert launched_late["Memset (Unknown)"].launched_late_us == 0 and not launched_late["Memset (Unknown)"].host_bound
    assert launched_late["Memset (Unknown)"].host_op == "encoder"


def test_host_ops_named_for_the_longest_only():
    found = gaps(TRACE, name_host_ops=1)
    assert found[0].host_op == "aten::mm" and found[1].host_op == ""


def test_summary_per_call():
    s = summary(gaps(TRACE), calls=2, top=2)
    assert s["idle_us_per_call"] == 20.5 and s["host_bound_us_per_call"] == 10 and s["gaps_per_call"] == 1.5
    assert [g["before"] for g in s["longest"]] == ["triton_fused", "Memset (Unknown)"]
