"""The README tells the truth: its example's output is what fdsl prints, its example file is the
one in examples/, and .ci/run runs its test command as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```\n(.*?)```", README, re.S)


def test_the_example_and_its_output_are_real():
    program = (ROOT / "examples" / "one_layer.fd").read_text()
    shown = BLOCKS[0]
    # the README shows the program without its first comment line
    assert shown.strip() == program.split("\n", 1)[1].strip()
    r = subprocess.run([sys.executable, "-m", "fdsl.cli", "run", "examples/one_layer.fd"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == BLOCKS[1]


def test_set_up_commands_are_the_main_job_and_the_tests():
    commands = [b.strip() for b in BLOCKS if b.count("\n") <= 2]
    # a virtual environment first: Debian's and Ubuntu's own Python refuse a bare pip install
    assert "python3 -m venv .venv && . .venv/bin/activate\npip install . && fdsl run examples/encoder2.fd" \
        in commands
    test_command = "python -m pip install -e '.[test,torch]' && python -m pytest -q"
    assert test_command in commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command.replace(" &&", " </dev/null &&") + " </dev/null" in ci


def test_every_example_named_in_the_readme_exists():
    for name in set(re.findall(r"examples/[\w/]+\.(?:fd|rules|svg)", README)):
        assert (ROOT / name).exists(), name


def _shown_with_its_output(example: str) -> None:
    """The README shows ``example`` (without its first comment line), and after it what ``fdsl
    run`` prints."""
    program = (ROOT / "examples" / example).read_text()
    i = next(i for i, b in enumerate(BLOCKS) if b.strip() == program.split("\n", 1)[1].strip())
    r = subprocess.run([sys.executable, "-m", "fdsl.cli", "run", "examples/" + example], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == BLOCKS[i + 1]


def test_the_elementwise_example_and_its_output_are_real():
    _shown_with_its_output("elementwise.fd")


def test_the_attention_pooling_example_and_its_output_are_real():
    _shown_with_its_output("pooling.fd")


def test_the_gpt_example_its_output_and_its_training_are_real():
    program = (ROOT / "examples" / "gpt.fd").read_text()
    i = next(i for i, b in enumerate(BLOCKS) if b.strip() == program.split("\n", 1)[1].strip())
    r = subprocess.run([sys.executable, "-m", "fdsl.cli", "run", "examples/gpt.fd"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == BLOCKS[i + 1]
    command = "fdsl train examples/gpt.fd --form w --steps 40 --lr 0.05 --random 0"
    assert command + "\n" in BLOCKS
    r = subprocess.run([sys.executable, "-m", "fdsl.cli"] + command.split()[1:], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert "ends with `%s`" % last in README


def test_the_encoder_shown_is_the_example_file():
    program = (ROOT / "examples" / "encoder2.fd").read_text()
    shown = next(b for b in BLOCKS if b.startswith("dim n = 8, d = 6, k = 4, h = 5") and "encoder(L)" in b)
    assert shown.strip() == program.split("\n", 1)[1].strip()


# ---- transcripts: blocks of "$ COMMAND" lines, each followed by its output ----------------------------

TRANSCRIPTS = [b for b in BLOCKS if b.startswith("$ ")]


def _steps(block):
    """(command, expected output, whole?) for each "$ " line; an output ending in a line "..." is
    a prefix of the real one."""
    steps = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append([line[2:], []])
        else:
            steps[-1][1].append(line)
    out = []
    for command, lines in steps:
        whole = not (lines and lines[-1] == "...")
        out.append((command, "\n".join(lines if whole else lines[:-1]) + ("\n" if lines else ""), whole))
    return out


def test_the_readme_has_transcripts_of_the_main_commands():
    commands = [c for b in TRANSCRIPTS for c, _, _ in _steps(b)]
    assert "fdsl run examples/encoder2.fd" in commands
    assert "fdsl --version" in commands and "python -m fdsl --help" in commands
    assert any(c.endswith("| fdsl run -") for c in commands)
    assert any(c.startswith("fdsl run -e ") for c in commands)


@pytest.mark.parametrize("command, expected, whole",
                         [s for b in TRANSCRIPTS for s in _steps(b)], ids=lambda x: str(x)[:40])
def test_transcript_output_is_real(command, expected, whole):
    """Each command of a README transcript, run in a shell with ``fdsl`` this checkout's."""
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=str(ROOT), FDSL_PROGRESS="0")
    script = 'fdsl() { "%s" -m fdsl "$@"; }\npython() { "%s" "$@"; }\n%s' % (sys.executable, sys.executable, command)
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    if whole:
        assert r.stdout == expected
    else:
        assert r.stdout.startswith(expected)


def test_the_deep_encoder_section_is_the_natural_program_and_its_real_output():
    section = README[README.index("## Deep encoders"):README.index("## The repl")]
    program, output = re.findall(r"```\n(.*?)```", section, re.S)[:2]
    text = (ROOT / "examples" / "natural.fd").read_text()
    assert program == text[text.index("layer(i, Z)"):]
    assert ":=" not in program  # the manual's spelling
    r = subprocess.run([sys.executable, "-m", "fdsl.cli", "run", "examples/natural.fd"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == output


# ---- issue 22: every command the README shows runs as shown --------------------------------------------


def test_the_subcommand_list_is_complete():
    from fdsl.cli.main import build_parser

    listed = re.search(r"The subcommands are (.*?);", README, re.S).group(1)
    named = set(re.findall(r"`(\w+)`", listed))
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert named == set(sub.choices)


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "bench").glob("*.py")))
def test_every_bench_script_prints_help_without_running(script):
    r = subprocess.run([sys.executable, "bench/" + script, "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: ") and r.stdout.count("\n") < 40  # help only, no table


def test_the_frontend_benchmark_runs():
    assert "python bench/frontend.py" in README
    r = subprocess.run([sys.executable, "bench/frontend.py", "--repeats", "1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    assert "encoder(L) alone, median" in r.stdout


def test_the_torch_extra_is_the_pin_of_ci():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^torch = \[\n    "torch==2\.13\.0",\n\]', pyproject, re.M)
    assert "'.[test,torch]'" in (ROOT / ".ci" / "run").read_text()


def test_the_size_limit_help_and_the_readme_count_the_same_thing():
    from fdsl.cli.main import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "term cells (each new node with its operands)" in " ".join(text.split())
    assert "`--size-limit N` term cells (default 50,000,000: each new node with its\n  operands" in README


def test_the_failing_loop_example_says_what_it_prints(run_fdsl):
    r = run_fdsl("run", "loop.fd", cwd=ROOT / "examples" / "failing")
    assert r.returncode == 2
    comment = (ROOT / "examples" / "failing" / "loop.fd").read_text()
    quoted = re.search(r'\("(.*?)",', " ".join(line.lstrip("# ") for line in comment.splitlines())).group(1)
    assert quoted in r.stderr


def test_running_the_flows_example_leaves_the_checkout_unmodified(run_fdsl):
    git = subprocess.run(["git", "status", "--porcelain", "examples"], cwd=ROOT, capture_output=True, text=True)
    if git.returncode != 0:
        pytest.skip("not a git checkout")
    r = run_fdsl("run", "examples/flows.fd", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    after = subprocess.run(["git", "status", "--porcelain", "examples"], cwd=ROOT, capture_output=True, text=True)
    assert after.stdout == git.stdout


def test_the_onehot_example_and_its_output_are_real():
    _shown_with_its_output("onehot.fd")


def test_the_initial_values_example_and_its_output_are_real():
    _shown_with_its_output("init.fd")


def test_the_autocast_example_and_its_output_are_real(tmp_path):
    """The mixed-precision example (issue 29, item 4) runs on the chargpt module and prints what
    the README shows."""
    i = next(i for i, b in enumerate(BLOCKS) if 'torch.autocast("cpu", dtype=torch.bfloat16)' in b
             and b.startswith("import torch"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "fdsl", "codegen", str(ROOT / "examples" / "chargpt.fd"), "--form", "w",
                        "--target", "torch", "-o", "chargpt_torch.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    (tmp_path / "example.py").write_text(BLOCKS[i])
    r = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == BLOCKS[i + 1]


def test_the_nanogpt_training_and_its_output_are_real(tmp_path):
    """The README's short run of examples/train_nanogpt.py prints what the README shows (the
    command as written, its --out a temporary folder)."""
    i = next(i for i, b in enumerate(BLOCKS) if b.startswith("python examples/train_nanogpt.py"))
    args = BLOCKS[i].split()[2:]
    assert args[args.index("--out") + 1] == "/tmp/nanogpt-tiny"
    args[args.index("--out") + 1] = str(tmp_path)
    r = subprocess.run([sys.executable, "examples/train_nanogpt.py"] + args, cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    assert r.stdout == BLOCKS[i + 1]
