"""examples/train_nanogpt.py trains examples/nanogpt.fd as nanoGPT's train.py trains its model.

The runs use examples/nanogpt_tiny.fd, nanogpt.fd with its dims and its counts of blocks and
heads made small (``shrunk`` below makes it from nanogpt.fd, and the test holds the file to it).
The agreement test compares, in float64, the losses of 10 steps of the script's training step
(AdamW with decay groups, the cosine schedule, clipping) and the weights after them with the
same steps of nanoGPT's model as its model.py writes it (bench/nanogpt_ref.py), weights copied
by name.

bfloat16: ``--dtype bfloat16`` trains under ``torch.autocast``, which the generated module runs
under (its products in bfloat16, the rest and the weights in float32).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "train_nanogpt.py"
TINY = ROOT / "examples" / "nanogpt_tiny.fd"
TEXT = ROOT / "examples" / "shakespeare.txt"


def shrunk(source: str, blocks: int, heads: int, dims: str) -> str:
    """examples/nanogpt.fd's text with ``blocks`` blocks of ``heads`` heads and the dims line
    ``dims``, its leading comment dropped; the rest of the model as it is."""
    body = "\n".join(line for line in source.split("\n") if not line.startswith("#")).lstrip("\n")
    words = {2: "two", 1: "one", 3: "three", 4: "four"}
    out = re.sub(r"^dim n = 256, v = 65, d = 384, k = 64, f = 1536", "dim " + dims, body, flags=re.M)
    out = out.replace("heads(i, 5, ", "heads(i, %d, " % (heads - 1)).replace("# six heads", "# %s heads" % words[heads])
    out = out.replace("gpt(6)", "gpt(%d)" % blocks).replace("# six blocks;", "# %s blocks;" % words[blocks])
    assert out.count("dim ") == 1 and out != body
    return out


def run(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def script():
    spec = importlib.util.spec_from_file_location("train_nanogpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference():
    spec = importlib.util.spec_from_file_location("nanogpt_ref", ROOT / "bench" / "nanogpt_ref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help():
    r = run("--help", timeout=120)
    assert r.returncode == 0, r.stderr
    for flag in ("--data", "--program", "--resume", "--device", "--dtype", "--steps", "--batch", "--seed", "--out"):
        assert flag in r.stdout


def test_the_tiny_program_is_nanogpt_shrunk():
    tiny = TINY.read_text()
    body = "\n".join(line for line in tiny.split("\n") if not line.startswith("#")).lstrip("\n")
    assert body == shrunk((ROOT / "examples" / "nanogpt.fd").read_text(), 2, 2,
                          "n = 32, v = 65, d = 32, k = 16, f = 128")


def test_a_smoke_run_trains_saves_resumes_and_samples(tmp_path):
    program = tmp_path / "small.fd"  # smaller still: one block of two heads, context 16
    program.write_text(shrunk((ROOT / "examples" / "nanogpt.fd").read_text(), 1, 2,
                              "n = 16, v = 65, d = 32, k = 16, f = 128"))
    out = tmp_path / "out"
    common = ["--program", str(program), "--data", str(TEXT), "--out", str(out), "--batch", "8", "--eval-iters", "8",
              "--eval-interval", "10", "--warmup", "2", "--lr", "3e-3", "--threads", "1"]
    r = run(*common, "--steps", "20", "--sample", "60")
    assert r.returncode == 0, r.stderr
    losses = {int(m[0]): (float(m[1]), float(m[2]))
              for m in re.findall(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)$", r.stdout, re.M)}
    assert sorted(losses) == [0, 10, 20], r.stdout
    assert abs(losses[0][0] - math.log(60)) < 0.3  # nanoGPT's start: about uniform over the characters
    assert losses[20][0] < losses[0][0] - 0.3 and losses[20][1] < losses[0][1] - 0.2, losses
    assert "20/20" in r.stderr  # the progress bar's last line
    sample = r.stdout.split("sample:\n", 1)[1]
    assert len(sample) == 1 + 60 + 1 and set(sample) <= set(TEXT.read_text())  # --start, 60 characters, newline
    # the checkpoint: the Model's state_dict by printed name, the step, the vocabulary
    state = torch.load(out / "ckpt.pt", weights_only=True)
    assert state["iter_num"] == 20 and "".join(state["chars"]) == "".join(sorted(set(TEXT.read_text())))
    assert {"E", "P", "Q_0_0", "K_0_1", "W2_0", "gf"} <= set(state["model"])
    assert state["model"]["gf"].shape == (32,)
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    assert len(list(out.glob("model-*.py"))) == 1 and len(list(out.glob("logits-*.py"))) == 1  # cached
    r2 = run(*common, "--steps", "25", "--resume", "--sample", "0")
    assert r2.returncode == 0, r2.stderr
    assert "resuming from step 20 of" in r2.stdout
    assert re.search(r"^step 25: train loss", r2.stdout, re.M) and "step 0:" not in r2.stdout
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 25
    assert len(list(out.glob("model-*.py"))) == 1  # generated once


def test_a_text_with_more_characters_than_v_is_refused(tmp_path):
    text = tmp_path / "wide.txt"
    text.write_text("".join(chr(48 + i) for i in range(70)) * 20, encoding="utf-8")
    r = run("--program", str(TINY), "--data", str(text), "--out", str(tmp_path), "--steps", "1")
    assert r.returncode == 2
    assert "70 distinct characters, more than the program's vocabulary v = 65" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_bad_program_is_located(tmp_path):
    bad = tmp_path / "bad.fd"
    bad.write_text("dim n = 4\nweight W : n x n\nw = -d(trace(W W^t)) +\n")
    r = run("--program", str(bad), "--data", str(TEXT), "--out", str(tmp_path / "o"), "--steps", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "bad.fd:3:" in r.stderr


def test_a_loss_that_is_not_finite_stops_the_run(tmp_path):
    r = run("--program", str(TINY), "--data", str(TEXT), "--out", str(tmp_path), "--steps", "10", "--batch", "2",
            "--eval-iters", "1", "--lr", "1e30", "--warmup", "0", "--grad-clip", "0", "--sample", "0")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "the loss is nan" in r.stderr or "the loss is inf" in r.stderr
    assert "Traceback" not in r.stderr


def test_float64_steps_agree_with_nanogpt(tmp_path):
    """10 float64 steps of the script (AdamW with decay groups, warmup and cosine, clipping) and of
    nanoGPT's model.py-style model from the same weights on the same batches: losses and weights
    to 1e-10."""
    s, ref_module = script(), reference()
    module, sampler, n, v = s.modules(str(TINY), "w", tmp_path)
    torch.manual_seed(0)
    model = module.Model(dtype=torch.float64)
    s.init_weights(model)
    names = {name: p.detach() for name, p in model.named_weights()}
    assert float(names["gf"].min()) == 1.0 and float(names["g2_1"].max()) == 1.0
    assert abs(float(names["W2_1"].std()) - 0.02 / math.sqrt(4)) < 0.003  # 0.02/sqrt(2 x blocks)
    assert abs(float(names["Q_0_1"].std()) - 0.02) < 0.003
    ref = ref_module.reference_of(model)  # scaled_dot_product_attention(is_causal=True), as nanoGPT's
    chars, train, val = s.prepare(TEXT.read_text(), v)
    ours = s.configure_optimizer(model, 0.1, 1e-3, (0.9, 0.99), "cpu")
    theirs = ref_module.configure_optimizer(ref, 0.1, 1e-3, (0.9, 0.99))
    assert len(ours.param_groups[0]["params"]) == len(model.state_dict()) - sum(
        1 for p in model.parameters() if p.dim() < 2)
    g = torch.Generator().manual_seed(3)
    import contextlib

    for it in range(10):
        x, y = s.get_batch(train, n, 4, g, "cpu")
        lr = s.get_lr(it, 1e-3, 1e-4, 2, 10)
        mine = s.train_step(model, ours, x, y, lr, 1.0, contextlib.nullcontext)
        for group in theirs.param_groups:  # nanoGPT's loop, as train.py writes it
            group["lr"] = lr
        loss = ref(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        theirs.step()
        theirs.zero_grad(set_to_none=True)
        theirs_loss = float(loss.detach())
        assert abs(mine - theirs_loss) <= 1e-10 * abs(theirs_loss), (it, mine, theirs_loss)
    views = ref_module.views(ref, ref_module.config_of(module.SHAPES))
    for name, p in model.named_weights():
        want = views[name].detach().reshape(p.shape)
        # (the key biases have no gradient, a softmax does not see a constant added to a row: they
        # stay at 0 up to rounding, so they are compared at the scale of a step, 1e-3)
        assert float((p.detach() - want).abs().max()) <= 1e-10 * max(float(want.abs().max()), 1e-3), name
    # and the sample's logits are the model's: its loss from them
    with torch.no_grad():
        x, y = s.get_batch(val, n, 1, g, "cpu")
        weights = {name: module._declared(name, p) for name, p in model.named_weights()}
        logits = sampler.grads(dict(weights, X=x[0]))["logits"]
        want = torch.nn.functional.cross_entropy(logits, y[0], reduction="sum")
        assert abs(float(model(X=x, Y=y)) - float(want)) <= 1e-10 * float(want)


def test_bfloat16_under_autocast(tmp_path):
    common = ["--program", str(TINY), "--data", str(TEXT), "--out", str(tmp_path), "--steps", "10", "--batch", "4",
              "--eval-iters", "4", "--eval-interval", "10", "--sample", "20", "--threads", "1"]
    r = run(*common, "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    f = run(*common, "--out", str(tmp_path / "f32"))
    assert f.returncode == 0, f.stderr

    def losses(out):
        return [float(m) for m in re.findall(r"train loss ([\d.]+)", out)]

    for a, b in zip(losses(r.stdout), losses(f.stdout)):
        assert abs(a - b) <= 3e-2 * b  # bfloat16's precision: 8 bits of mantissa
