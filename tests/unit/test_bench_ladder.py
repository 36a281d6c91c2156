"""bench.ladder end to end on the CPU at the smallest size: it writes the table, the JSON and the chart
(SAM 1's vit_tiny beside segment_anything, SAM 2's sam2.1_hiera_nano beside sam2)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import ladder
from parity.reference import sam2_reference_config


@pytest.fixture
def two_prompts_an_image(monkeypatch):
    """Two prompts an image instead of the bench's 5..15 (14 for its seeded image): the quick runs check that
    rows, tables and charts get written, and the decoder's calls on 14 prompts took about a third of their
    time; two keep several prompts through one decoder call."""
    monkeypatch.setattr(ladder, "PROMPTS_PER_IMAGE", (2, 2))


@pytest.mark.usefixtures("two_prompts_an_image")
def test_quick_cpu_run_writes_markdown_json_and_chart(tmp_path):
    # one samfast stage beside the reference: the plumbing is the same for every stage (each costs ~20 s here)
    assert ladder.main(["--quick", "--cpu", "--models", "vit_tiny", "--batches", "1", "--stages", "fp32+nt",
                        "--reference", "fp32", "--profile", "vit_tiny:1:fp32+nt", "--warmup", "0", "--repeats", "1",
                        "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert [r["stage"] for r in results] == ["reference fp32", "fp32+nt"]
    assert all(r["notes"]["prompts"] == 2 for r in results)
    for r in results:
        assert r["error"] is None and r["encoder_img_s"] > 0 and r["e2e_img_s"] > 0, r
        assert r["notes"]["compiled_while_timed"] == 0, r  # counted around both timed calls (bench.timing)
    table = (tmp_path / "bench.md").read_text()
    assert "| vit_tiny | 1 | fp32+nt |" in table and (tmp_path / "bench.png").stat().st_size > 0
    # the command is the one main was given (not pytest's argv), so the report can be rerun as written
    assert "- command: `python -m bench.ladder --quick --cpu --models vit_tiny --batches 1 --stages fp32+nt" in table
    # the profiled row names where the time goes, for the encoder alone and for the whole pipeline
    profiled = results[-1]["notes"]["profile"]
    assert set(profiled) == {"encoder", "e2e"} and all(profiled[part] for part in profiled)
    assert "fp32+nt, encoder" in table and "fp32+nt, e2e" in table


@pytest.mark.usefixtures("two_prompts_an_image")
def test_quick_cpu_run_of_a_sam2_model_beside_sam2(tmp_path):
    """SAM 2 (the small nano config) beside the reference sam2 with the same seeded weights; sam2's
    compiled bf16 path is recorded as skipped on a CPU, a stage not built for SAM 2 as not built."""
    pytest.importorskip("sam2", reason="the SAM 2 reference package sam2==1.1.0 is not installed")
    assert ladder.main(["--quick", "--cpu", "--models", "sam2.1_hiera_nano", "--batches", "1", "--stages", "fp32", "sparse",
                        "--reference", "fp32", "bf16", "--warmup", "0", "--repeats", "1", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert [(r["impl"], r["stage"]) for r in results] == [
        ("reference", "reference fp32"), ("reference", "reference bf16+compile"), ("samfast", "fp32"), ("samfast", "sparse")]
    reference, reference_bf16, fp32, sparse = results
    for r in (reference, fp32):
        assert r["error"] is None and r["skipped"] is None and r["encoder_img_s"] > 0 and r["e2e_img_s"] > 0, r
    assert reference["notes"]["version"] == "1.1.0" and reference["notes"]["prompts"] == fp32["notes"]["prompts"]
    assert reference_bf16["error"] is None and "GPU only" in reference_bf16["skipped"] and reference_bf16["encoder_img_s"] is None
    assert sparse["error"] is None and sparse["skipped"].startswith("not built for SAM 2") and sparse["build_s"] is None
    table = (tmp_path / "bench.md").read_text()
    assert "| sam2.1_hiera_nano | 1 | reference fp32 |" in table and "| sam2.1_hiera_nano | 1 | fp32 |" in table
    assert "seeded synthetic" in table and "SAM 2 rows:" in table and "reference sam2 1.1.0" in table
    assert (tmp_path / "bench.png").stat().st_size > 0


def test_default_stages_and_reference_rows_follow_the_family():
    """Planning only (nothing built): SAM 2 runs the default stages built for it, beside sam2's fp32 and
    compiled bf16; SAM 1 keeps the whole ladder beside segment_anything."""
    rows = ladder.plan(ladder.parse_args(["--cpu", "--models", "vit_b", "sam2.1_hiera_l", "--batches", "1"]))
    stages = {model: [r.stage for r in rows if r.model == model] for model in ("vit_b", "sam2.1_hiera_l")}
    sam2_stages = [stage for stage in ladder.DEFAULT_STAGES if "sparse" not in stage]  # all but 2:4 are built
    assert stages["sam2.1_hiera_l"] == ["reference fp32", "reference bf16+compile", *sam2_stages]
    assert stages["vit_b"] == ["reference fp32", "reference bf16", *ladder.DEFAULT_STAGES]
    assert not any(r.skipped for r in rows)


def test_sam2_reference_config_names_sam2s_config_and_overrides():
    assert sam2_reference_config("sam2.1_hiera_l") == ("configs/sam2.1/sam2.1_hiera_l.yaml", [])
    assert sam2_reference_config("sam2_hiera_b+") == ("configs/sam2/sam2_hiera_b+.yaml", [])
    config, overrides = sam2_reference_config("sam2.1_hiera_nano")  # no sam2 config: hiera_t's, reshaped
    assert config == "configs/sam2.1/sam2.1_hiera_t.yaml"
    assert {"++model.image_encoder.trunk.embed_dim=32", "++model.image_encoder.trunk.stages=[1,1,2,1]",
            "++model.image_encoder.trunk.global_att_blocks=[3]",
            "++model.image_encoder.neck.backbone_channel_list=[256,128,64,32]"} <= set(overrides)


@pytest.mark.parametrize(("argv", "expected"), [
    ([], "default"),  # sam2 compiles in samfast's mode unless told
    (["--reference-compile-mode", "max-autotune"], "max-autotune"),  # as sam2 ships it
])
def test_sam2s_compiled_row_compiles_in_the_mode_asked_for(monkeypatch, argv, expected):
    """Planning and building only, nothing run: the mode reaches sam2's model (its compile_image_encoder)."""
    import sam2.sam2_image_predictor

    modes = []
    monkeypatch.setenv("SAMFAST_COMPILE_MODE", "default")
    monkeypatch.setattr(ladder, "reference_model", lambda model_type, device, compile_mode: modes.append(compile_mode))
    monkeypatch.setattr(sam2.sam2_image_predictor, "SAM2ImagePredictor", lambda sam: None)
    args = ladder.parse_args(["--models", "sam2.1_hiera_l", "--batches", "8", "--stages", "sdpa", *argv])
    row = next(r for r in ladder.plan(args) if r.stage == "reference bf16+compile")
    runner = ladder.make_runner(row, torch.device("cuda"), args.reference_compile_mode)
    assert modes == [expected] and expected in runner.notes()["dtype"]


def test_a_gpu_profile_is_summed_by_kind_below_its_longest_kernels():
    """What a GPU run's profiled row prints (bench.kernel_kinds): its every kernel's time per kind, with shares."""
    args = ladder.parse_args(["--cpu", "--models", "vit_tiny", "--batches", "1"])
    env = {**ladder.ladder_environment(torch.device("cpu"), args, []), "capability": "9.0"}  # as a GPU's environment names it
    top = [{"name": "nvjet_sm90_tst_192x192", "self_us_per_call": 30.0, "calls": 1, "share": 0.75}]
    kinds = {"GEMM (cuBLAS / CUTLASS)": 30.0, "inductor fused (triton_*)": 10.0}
    row = ladder.Row("vit_tiny", 1, "nt", "samfast", notes={"profile": {"encoder": top}, "profile_kinds": {"encoder": kinds}})
    row.encoder_img_s = 1 / 50e-6  # a timed call of 50 us: 40 of kernels, 10 idle
    text = ladder.markdown(env, [row])
    assert "| `nvjet_sm90_tst_192x192` | 30 | 1 | 75.0% |" in text
    assert "| GEMM (cuBLAS / CUTLASS) | 30 | 75.0% |" in text and "| inductor fused (triton_*) | 10 | 25.0% |" in text
    assert "Kernels 0.04 ms of a timed encoder call of 0.05 ms" in text and "idles 0.01 ms (20.0%)" in text


def test_a_gpu_profile_names_its_longest_idle_gaps():
    """bench.kernel_gaps' summary as the row prints it: idle per call, the host-bound part, the longest gaps."""
    args = ladder.parse_args(["--cpu", "--models", "vit_tiny", "--batches", "1"])
    env = {**ladder.ladder_environment(torch.device("cpu"), args, []), "capability": "9.0"}
    found = {"idle_us_per_call": 2900.0, "host_bound_us_per_call": 2100.0, "gaps_per_call": 640.0,
             "longest": [{"idle_us": 812.0, "after": "nvjet|x", "before": "triton_per_fused_0", "launched_late_us": 790.0,
                          "host_op": "aten::_scaled_dot_product_cudnn_attention"}]}
    row = ladder.Row("vit_tiny", 1, "nt", "samfast", notes={"profile": {"encoder": []}, "profile_gaps": {"encoder": found}})
    text = ladder.markdown(env, [row])
    assert "the GPU idled 2900 us a call in 640 gaps; 2100 us of it host-bound" in text
    assert "| 812 | `nvjet/x` | `triton_per_fused_0` | 790 | aten::_scaled_dot_product_cudnn_attention |" in text
