"""Which SDK `qnnctl install` picks, and SDKs already on disk that it reuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.errors import UnsupportedHostError, UsageError
from qnnctl.sdk.cache import read_manifest
from qnnctl.sdk.hosts import require_supported_host
from qnnctl.sdk.layout import Sdk
from qnnctl.sdk.select import BY_PIN, Selection, executorch_expected_version
from tests.conftest import run_qnnctl
from tests.httpserver import FaultServer
from tests.sdkfactory import OTHER_VERSION, VERSION, SdkSpec, build_sdk_tree, install_tree_into_cache

PATH = f"/{VERSION}/v{VERSION}.zip"


def _env(**changes: str) -> dict[str, str]:
    env = os.environ.copy()
    env.update(changes)
    return env


# -- QNN_SDK_ROOT ----------------------------------------------------------------------------


def test_empty_sdk_root_leaves_the_sdk_to_the_caller(mirror: FaultServer, cache_dir: Path) -> None:
    result = run_qnnctl("install", env=_env(QNN_SDK_ROOT=""))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "caller" in result.stderr
    assert "empty" in result.stderr
    assert "''" not in result.stderr
    assert '""' not in result.stderr
    assert mirror.requests == []
    assert not (cache_dir / "sdks").exists()


def test_explicit_version_wins_over_an_empty_sdk_root(mirror: FaultServer, cache_dir: Path) -> None:
    result = run_qnnctl("install", VERSION, env=_env(QNN_SDK_ROOT=""))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION


def test_valid_sdk_root_is_used_as_it_is(mirror: FaultServer, tmp_path: Path) -> None:
    root = build_sdk_tree(tmp_path / "vendor" / "qairt")
    result = run_qnnctl("install", env=_env(QNN_SDK_ROOT=str(root)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert mirror.requests == []


@pytest.mark.parametrize("broken", ["no-libs", "missing"])
def test_invalid_sdk_root_names_what_is_missing(mirror: FaultServer, tmp_path: Path, broken: str) -> None:
    root = tmp_path / "vendor" / "qairt"
    if broken == "no-libs":
        build_sdk_tree(root)
        for lib in (root / "lib" / "x86_64-linux-clang").iterdir():
            lib.unlink()
    result = run_qnnctl("install", env=_env(QNN_SDK_ROOT=str(root)))
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert str(root) in result.stderr
    if broken == "no-libs":
        assert "lib/x86_64-linux-clang/libQnnHtp.so" in result.stderr
        assert "lib/x86_64-linux-clang/libQnnSystem.so" in result.stderr
    else:
        assert f"qnnctl: error: QNN_SDK_ROOT {root} does not exist\n" in result.stderr
        assert "missing the folder itself" not in result.stderr
    assert mirror.requests == []


# -- ExecuTorch's cache ----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["QNN_STAGING_DIR", "XDG_CACHE_HOME"])
def test_executorch_cache_is_reused(mirror: FaultServer, tmp_path: Path, cache_dir: Path, where: str) -> None:
    env = _env()
    if where == "QNN_STAGING_DIR":
        env["QNN_STAGING_DIR"] = str(tmp_path / "staging")
        root = tmp_path / "staging" / f"sdk-{VERSION}"
    else:
        root = Path(env["XDG_CACHE_HOME"]) / "executorch" / "qnn" / f"sdk-{VERSION}"
    build_sdk_tree(root)
    result = run_qnnctl("install", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert f"SDK {VERSION} is already installed in ExecuTorch's cache" in result.stderr
    assert mirror.requests == []
    assert not (cache_dir / "sdks").exists()


def test_home_cache_is_the_executorch_default(mirror: FaultServer, tmp_path: Path) -> None:
    env = _env()
    del env["XDG_CACHE_HOME"]
    root = Path(env["HOME"]) / ".cache" / "executorch" / "qnn" / f"sdk-{VERSION}"
    build_sdk_tree(root)
    result = run_qnnctl("install", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert mirror.requests == []


def test_incomplete_executorch_cache_is_not_reused(mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    # ExecuTorch writes no completion marker: an interrupted copy lacks its libraries.
    root = tmp_path / "staging" / f"sdk-{VERSION}"
    build_sdk_tree(root)
    (root / "lib" / "x86_64-linux-clang" / "libQnnSystem.so").unlink()
    result = run_qnnctl("install", env=_env(QNN_STAGING_DIR=str(tmp_path / "staging")))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION
    assert len(mirror.requests_for(PATH)) == 1


# -- the project pin -------------------------------------------------------------------------


def test_pin_is_found_upward_from_a_subfolder(mirror: FaultServer, cache_dir: Path) -> None:
    project = Path.cwd()
    (project / ".qnn-version").write_text("# this project's SDK\n2.34\n")
    deeper = project / "src" / "models"
    deeper.mkdir(parents=True)
    root = install_tree_into_cache(cache_dir, OTHER_VERSION)
    result = run_qnnctl("install", cwd=deeper)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert mirror.requests == []


def test_nearest_pin_wins(mirror: FaultServer, cache_dir: Path) -> None:
    project = Path.cwd()
    (project / ".qnn-version").write_text(f"{OTHER_VERSION}\n")
    inner = project / "inner"
    inner.mkdir()
    (inner / ".qnn-version").write_text(f"{VERSION}\n")
    result = run_qnnctl("install", cwd=inner)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION


@pytest.mark.parametrize("content", [b"latest\n", b"\xff\xfe2.37\n"])
def test_a_bad_pin_names_its_file(mirror: FaultServer, content: bytes) -> None:
    pin = Path.cwd() / ".qnn-version"
    pin.write_bytes(content)
    for command in (("install",), ("env",)):
        result = run_qnnctl(*command)
        assert result.returncode == 2, result.stderr
        assert str(pin) in result.stderr
        assert "qnnctl use" in result.stderr
        assert "unexpected" not in result.stderr
    assert mirror.requests == []


def test_a_pin_larger_than_a_pin_can_be_is_refused_unread(mirror: FaultServer, tmp_path: Path) -> None:
    """A project's pin may be a link to any file, and `qnnctl env` reads it at every prompt: one of
    400 MB took 9 s and 800 MB of memory. Past 64 KiB it is refused; within them, read whole."""
    big = tmp_path / "big"
    big.write_text(f"{VERSION}\n" + "#" * (1 << 20) + "\n")
    pin = Path.cwd() / ".qnn-version"
    pin.symlink_to(big)
    for command in (("install",), ("env",), ("lower", "--dry-run", "--", "true")):
        result = run_qnnctl(*command)
        assert result.returncode == 2, result.stderr
        assert f"qnnctl: error: {pin} is larger than a pin can be (65536 bytes)" in result.stderr
        assert "unexpected" not in result.stderr
    assert mirror.requests == []
    big.write_text("# " + "c" * ((64 << 10) - 40) + f"\n{VERSION}\nhost\n")
    from qnnctl.sdk.pin import read_pin_components
    from qnnctl.sdk.select import read_pin

    assert (read_pin(pin), read_pin_components(pin)) == (VERSION, ("host",))


@pytest.mark.parametrize(("spec", "where"), [
    ("/nowhere/sdk", "/nowhere/sdk"), ("./gone", "gone"), ("../gone", "../gone"), (".hidden-sdk", ".hidden-sdk"),
    ("~", "home"), ("~/gone", "home/gone"), ("vendor/gone", "vendor/gone"),
])
def test_a_spec_written_as_a_path_is_a_path_though_nothing_is_there(spec: str, where: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a spec is a version or a path is read from how it is written, not from the disk:
    a folder that has gone is reported missing, not as a version no one wrote."""
    from qnnctl.sdk.select import BY_ARGUMENT, select_sdk

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = Path(os.path.join(tmp_path, where))  # an absolute `where` stays as it is
    assert select_sdk(spec, {}, tmp_path) == Selection(BY_ARGUMENT, f"given as {root}", root=root)


def test_relative_paths_are_read_from_the_folder_the_caller_names(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A library caller that passes a folder other than the process's own gets paths read from
    that folder: the spec's (written as a path, a bare folder name, a version-like path that is
    there) and QNN_SDK_ROOT's."""
    from qnnctl.sdk.select import BY_ARGUMENT, BY_ENV, select_sdk

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for folder in ("vendor", "v2", "2.37/sdk"):
        (project / folder).mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for spec in ("vendor", "v2", "./vendor", "2.37/sdk"):
        root = (project / spec).absolute()
        assert select_sdk(spec, {}, project) == Selection(BY_ARGUMENT, f"given as {root}", root=root)
    chosen = select_sdk(None, {"QNN_SDK_ROOT": "vendor"}, project)
    assert chosen == Selection(BY_ENV, "from QNN_SDK_ROOT", root=project / "vendor")
    # Read from the process's folder, `2.37/sdk` is not there: a mistyped version; so is a
    # bare name that is no folder there.
    with pytest.raises(UsageError, match=r"'2\.37/sdk' is not an SDK version"):
        select_sdk("2.37/sdk", {}, elsewhere)
    with pytest.raises(UsageError, match=r"'vendor' is not an SDK version"):
        select_sdk("vendor", {}, elsewhere)


def test_an_sdk_left_to_the_caller_is_not_one_qnnctl_can_resolve(cache_dir: Path, tmp_path: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import BY_CALLER, resolve_installed, select_sdk

    chosen = select_sdk(None, {"QNN_SDK_ROOT": ""}, tmp_path)
    assert chosen == Selection(BY_CALLER, "QNN_SDK_ROOT is exported but empty: the caller manages the SDK")
    with pytest.raises(UsageError) as caught:
        resolve_installed(chosen, Cache(cache_dir), {})
    assert caught.value.message == "the SDK is managed by the caller (QNN_SDK_ROOT is empty)"


def test_a_file_named_as_an_sdk_root_lacks_the_whole_layout(tmp_path: Path) -> None:
    """The error says the path is a file, and lists, as for any root, what is missing."""
    from qnnctl.errors import InvalidSdkError
    from qnnctl.sdk.layout import missing_layout, sdk_from_root

    archive = tmp_path / "qairt.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))
    with pytest.raises(InvalidSdkError) as caught:
        sdk_from_root(archive, "--sdk")
    assert caught.value.message == f"--sdk {archive} is a file, not a folder"
    assert caught.value.missing == missing_layout(archive) == ["the folder itself"]


def test_relative_paths_are_exported_absolute(tmp_path: Path) -> None:
    install_tree_into_cache(tmp_path / "rel-cache")
    env = _env(QNNCTL_CACHE_DIR="rel-cache")
    result = run_qnnctl("env", "--shell", "json", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    import json

    values = json.loads(result.stdout)
    root = tmp_path / "rel-cache" / "sdks" / VERSION
    assert values["QNN_SDK_ROOT"] == str(root)
    assert values["LD_LIBRARY_PATH"] == str(root / "lib" / "x86_64-linux-clang")
    user_root = build_sdk_tree(tmp_path / "vendor")
    for args, sdk_env in ((("--sdk", "vendor"), {}), ((), {"QNN_SDK_ROOT": "vendor"})):
        result = run_qnnctl("env", "--shell", "json", *args, env=_env(**sdk_env), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lib = json.loads(result.stdout)["LD_LIBRARY_PATH"]
        assert lib == str(user_root / "lib" / "x86_64-linux-clang")


def test_commands_use_the_sdk_this_shell_was_set_up_for_and_env_chooses_afresh(
        mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    """After `eval "$(qnnctl env VERSION)"` replaced the user's QNN_SDK_ROOT, the commands use
    that SDK (the shell's record); `qnnctl env` without a version chooses afresh (the user's)."""
    import json

    install_tree_into_cache(cache_dir)
    user_root = build_sdk_tree(tmp_path / "vendor" / "qairt")
    exported = json.loads(run_qnnctl("env", VERSION, "--shell", "json",
                                     env=_env(QNN_SDK_ROOT=str(user_root))).stdout)
    after = _env(**{k: v for k, v in exported.items() if v is not None})
    ours = cache_dir / "sdks" / VERSION
    assert after["QNN_SDK_ROOT"] == str(ours)
    installed = run_qnnctl("install", env=after)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.strip() == str(ours)
    doctor = json.loads(run_qnnctl("doctor", "--json", "--offline", env=after).stdout)
    selection = next(c for c in doctor["checks"] if c["id"] == "sdk.selection")
    assert selection["detail"].startswith(f"shell: this shell was set up for it by `qnnctl env` ({ours})")
    env_again = json.loads(run_qnnctl("env", "--shell", "json", env=after).stdout)
    assert env_again["QNN_SDK_ROOT"] == str(user_root)
    # Once the user exports a root of their own, the record no longer speaks for the shell.
    theirs = {**after, "QNN_SDK_ROOT": str(user_root)}
    assert run_qnnctl("install", env=theirs).stdout.strip() == str(user_root)
    assert mirror.requests == []


def test_bad_pin_is_a_usage_error(mirror: FaultServer) -> None:
    (Path.cwd() / ".qnn-version").write_text("latest\n")
    result = run_qnnctl("install")
    assert result.returncode == 2, result.stderr
    assert mirror.requests == []


# -- the version an installed ExecuTorch expects -----------------------------------------------


def _before_pythonpath(site: Path) -> str:
    """PYTHONPATH with `site` first: the rest still names the qnnctl under test."""
    return os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def _fake_executorch(site: Path, marker: Path, version: str = OTHER_VERSION) -> Path:
    """A package laid out like the ExecuTorch wheel; importing any part of it is detected."""
    package = site / "executorch"
    scripts = package / "backends" / "qualcomm" / "scripts"
    scripts.mkdir(parents=True)
    tripwire = (
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text(__name__)\n"
        "raise RuntimeError('executorch must not be imported')\n"
    )
    for folder in (package, package / "backends", package / "backends" / "qualcomm", scripts):
        (folder / "__init__.py").write_text(tripwire)
    (scripts / "download_qnn_sdk.py").write_text(
        tripwire
        + "import os\n"
        + f'QNN_VERSION = "{version}"\n'
        + "def install_qnn_sdk():\n    pass\n"
    )
    return package


def test_executorch_expectation_from_pythonpath(mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    marker = tmp_path / "executorch-was-imported"
    _fake_executorch(site, marker)
    root = install_tree_into_cache(cache_dir, OTHER_VERSION)
    install_tree_into_cache(cache_dir, VERSION)  # newer: ExecuTorch's expectation comes first
    result = run_qnnctl("install", env=_env(PYTHONPATH=_before_pythonpath(site)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert not marker.exists(), f"imported: {marker.read_text()}"
    assert mirror.requests == []


def test_executorch_expectation_from_sys_path(mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    site = tmp_path / "site-packages"
    marker = tmp_path / "executorch-was-imported"
    _fake_executorch(site, marker)
    root = install_tree_into_cache(cache_dir, OTHER_VERSION)
    install_tree_into_cache(cache_dir, VERSION)  # newer: ExecuTorch's expectation comes first
    code = f"import sys; sys.path.insert(0, {str(site)!r}); from qnnctl.cli import main; main(['install'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert not marker.exists()


def test_pin_wins_over_executorch(mirror: FaultServer, tmp_path: Path, cache_dir: Path) -> None:
    site = tmp_path / "site-packages"
    _fake_executorch(site, tmp_path / "marker")
    (Path.cwd() / ".qnn-version").write_text(f"{VERSION}\n")
    result = run_qnnctl("install", env=_env(PYTHONPATH=_before_pythonpath(site)))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION


def test_executorch_expectation_is_read_not_imported(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    package = _fake_executorch(tmp_path, marker)
    assert executorch_expected_version(package) == OTHER_VERSION
    assert not marker.exists()


def test_no_executorch_means_the_default(mirror: FaultServer, cache_dir: Path) -> None:
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cache_dir / "sdks" / VERSION


def _scripts(tmp_path: Path, downloader: bytes | None, config: bytes | None = None) -> Path:
    """An ExecuTorch package folder holding only the downloader and its qnn_config.sh."""
    package = tmp_path / "executorch"
    scripts = package / "backends" / "qualcomm" / "scripts"
    scripts.mkdir(parents=True)
    if downloader is not None:
        (scripts / "download_qnn_sdk.py").write_bytes(downloader)
    if config is not None:
        (scripts / "qnn_config.sh").write_bytes(config)
    return package


def test_executorch_config_wins_over_its_downloader(tmp_path: Path) -> None:
    # ExecuTorch 1.5: the downloader's own version is only the fallback for a missing config.
    downloader = f'QNN_VERSION = _QNN_CONFIG.get("QNN_VERSION", "{OTHER_VERSION}")\n'.encode()
    config = f'# the QAIRT release this ExecuTorch was built against\nQNN_VERSION="{VERSION}"\n'.encode()
    assert executorch_expected_version(_scripts(tmp_path, downloader, config)) == VERSION


@pytest.mark.parametrize("config", [None, b"# QNN_VERSION is set by the build\nQNN_SDK_ROOT=/opt/qairt\n"])
def test_executorch_downloader_speaks_when_its_config_names_no_version(tmp_path: Path,
                                                                       config: bytes | None) -> None:
    downloader = f'QNN_VERSION = "{OTHER_VERSION}"\n'.encode()
    assert executorch_expected_version(_scripts(tmp_path, downloader, config)) == OTHER_VERSION


@pytest.mark.parametrize("url", [
    f"https://softwarecenter.qualcomm.com/api/download/software/qualcomm_neural_processing_sdk/v{VERSION}.zip"
    f"  # unpacks to qairt/{VERSION}/",
    f"https://softwarecenter.qualcomm.com/api/download/software/sdks/Qualcomm_AI_Runtime_Community/All/{VERSION}/"
    f"v{VERSION}.zip",
])
def test_an_older_executorch_downloader_names_the_version_in_its_url(tmp_path: Path, url: str) -> None:
    downloader = f'QAIRT_URL = "{url}"\n'.encode()
    assert executorch_expected_version(_scripts(tmp_path, downloader)) == VERSION


@pytest.mark.parametrize("downloader", [None, b"def install_qnn_sdk():\n    pass  # QNN_VERSION comes later\n"])
def test_an_executorch_that_names_no_version_expects_none(tmp_path: Path, downloader: bytes | None) -> None:
    assert executorch_expected_version(_scripts(tmp_path, downloader)) is None


@pytest.mark.parametrize("comment", ["# réglé pour QAIRT\n".encode(), "# réglé pour QAIRT\n".encode("latin-1")])
def test_executorch_files_not_in_ascii_still_name_the_version(tmp_path: Path, comment: bytes) -> None:
    """A comment in UTF-8 or in Latin-1 hides no version, whatever the locale's encoding."""
    config = comment + f'QNN_VERSION="{VERSION}"\n'.encode()
    downloader = comment + f'QNN_VERSION = "{OTHER_VERSION}"\n'.encode()
    assert executorch_expected_version(_scripts(tmp_path / "both", downloader, config)) == VERSION
    assert executorch_expected_version(_scripts(tmp_path / "downloader", downloader)) == OTHER_VERSION


def test_executorch_with_a_latin1_downloader_is_followed_by_install(mirror: FaultServer, tmp_path: Path,
                                                                  cache_dir: Path) -> None:
    site = tmp_path / "site-packages"
    _scripts(site, "# réglé\n".encode("latin-1") + f'QNN_VERSION = "{OTHER_VERSION}"\n'.encode())
    root = install_tree_into_cache(cache_dir, OTHER_VERSION)
    result = run_qnnctl("install", env=_env(PYTHONPATH=_before_pythonpath(site)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert mirror.requests == []


def _only_on_sys_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `site` the whole of sys.path, with no ExecuTorch imported yet: where qnnctl looks."""
    import importlib

    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.delitem(sys.modules, "executorch", raising=False)
    importlib.invalidate_caches()


@pytest.mark.parametrize("layout", ["package", "namespace", "module", "none"])
def test_executorch_is_found_on_sys_path_without_importing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              layout: str) -> None:
    from qnnctl.sdk.select import executorch_package_dir

    site = tmp_path / "site-packages"
    site.mkdir()
    tripwire = "raise RuntimeError('executorch must not be imported')\n"
    expected: Path | None = site / "executorch"
    if layout == "module":
        (site / "executorch.py").write_text(tripwire)
        expected = site
    elif layout == "none":
        expected = None
    else:
        (site / "executorch").mkdir()
        if layout == "package":
            (site / "executorch" / "__init__.py").write_text(tripwire)
    _only_on_sys_path(site, monkeypatch)
    assert executorch_package_dir() == expected
    assert "executorch" not in sys.modules


def test_executorch_on_sys_path_is_the_one_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages"
    _scripts(site, f'QNN_VERSION = "{OTHER_VERSION}"\n'.encode())
    _only_on_sys_path(site, monkeypatch)
    assert executorch_expected_version() == OTHER_VERSION


def test_the_choice_of_executorchs_version_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.sdk.select import BY_EXECUTORCH, select_sdk

    site = tmp_path / "site-packages"
    _scripts(site, f'QNN_VERSION = "{OTHER_VERSION}"\n'.encode())
    _only_on_sys_path(site, monkeypatch)
    chosen = select_sdk(None, {}, tmp_path)
    assert chosen == Selection(BY_EXECUTORCH, "the version the installed ExecuTorch expects", version=OTHER_VERSION)
    # What doctor and `-v` print of it.
    assert chosen.describe() == f"SDK {OTHER_VERSION} (executorch: the version the installed ExecuTorch expects)"


def test_without_a_cache_nothing_installed_is_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.sdk.select import BY_DEFAULT, select_sdk
    from qnnctl.sdk.versions import DEFAULT_VERSION

    _only_on_sys_path(tmp_path / "no-executorch-here", monkeypatch)
    assert select_sdk(None, {}, tmp_path, cache=None) == Selection(
        BY_DEFAULT, "nothing here names another (no pin, no QNN_SDK_ROOT, no ExecuTorch, none installed)",
        version=DEFAULT_VERSION)


# -- version prefixes ------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "version"), [("2.37", VERSION), ("2.28", "2.28.2.241116"),
                                               ("2.28.0", "2.28.0.241029")])
def test_prefix_resolves_to_a_known_release(mirror: FaultServer, cache_dir: Path, spec: str, version: str) -> None:
    root = install_tree_into_cache(cache_dir, version)
    result = run_qnnctl("install", spec)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{root}\n"
    assert mirror.requests == []


@pytest.mark.parametrize("spec", ["2.99", "banana", "2.37.x", "2.3"])
def test_bad_version_is_a_usage_error(mirror: FaultServer, spec: str) -> None:
    result = run_qnnctl("install", spec)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    # A prefix that nothing installed matches is looked up in the mirror's index.json (it has
    # none here); no archive is asked for.
    asked = ["/index.json"] if spec[0].isdigit() and "x" not in spec else []
    assert [r.path for r in mirror.requests] == asked


# -- the host --------------------------------------------------------------------------------


@pytest.mark.parametrize(("system", "machine", "supported"), [
    ("Linux", "x86_64", True),
    ("Linux", "amd64", True),
    ("Linux", "aarch64", True),
    ("Linux", "arm64", True),
    ("Linux", "i686", False),
    ("Linux", "armv7l", False),
    ("Linux", "riscv64", False),
    ("Darwin", "arm64", False),
    ("Darwin", "x86_64", False),
    ("Windows", "AMD64", False),
])
def test_supported_hosts(system: str, machine: str, supported: bool) -> None:
    if supported:
        require_supported_host(system, machine)
        return
    with pytest.raises(UnsupportedHostError) as caught:
        require_supported_host(system, machine)
    assert caught.value.exit_code == 5
    assert f"{system}/{machine}" in caught.value.message
    assert "Linux x86_64 or Linux aarch64" in caught.value.message


@pytest.mark.parametrize(("forced", "named"), [
    ("Darwin/arm64", "Darwin/aarch64"), ("riscv64", "Linux/riscv64"), ("armv7l", "Linux/armv7l"),
    ("Windows/AMD64", "Windows/x86_64")])
@pytest.mark.parametrize("command", [["install"], ["env"], ["which", "libQnnHtp.so"], ["lower", "--", "true"]])
def test_an_unsupported_host_is_refused(mirror: FaultServer, cache_dir: Path, forced: str, named: str,
                                        command: list[str]) -> None:
    """Every command that needs the host's libraries refuses an unsupported host with exit 5,
    naming the hosts qnnctl supports, before it looks for (or fetches) any SDK."""
    env = {**os.environ, "QNNCTL_FORCE_MACHINE": forced}
    result = subprocess.run([sys.executable, "-m", "qnnctl", *command], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 5, result.stderr
    assert "Linux x86_64 or Linux aarch64" in result.stderr
    assert named in result.stderr
    assert result.stdout == ""
    assert mirror.requests == []
    assert not (cache_dir / "sdks").exists()


# -- the SDK you chose is the SDK you get --------------------------------------------------------

PIPELINE = """
import os, sys
print("ROOT=" + os.environ.get("QNN_SDK_ROOT", "-"))
"""
SETUP = """
import qnnctl
print("SETUP=" + str(qnnctl.setup_sdk().root))
"""


def _shell_for(version: str) -> dict[str, str]:
    """The environment of a shell after `eval "$(qnnctl env VERSION)"`."""
    import json

    exported = run_qnnctl("env", version, "--shell", "json")
    assert exported.returncode == 0, exported.stderr
    return _env(**{k: v for k, v in json.loads(exported.stdout).items() if v is not None})


def test_after_env_every_command_uses_that_sdk(mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    default = install_tree_into_cache(cache_dir, VERSION)
    chosen = install_tree_into_cache(cache_dir, OTHER_VERSION)
    shell = _shell_for(OTHER_VERSION)
    (tmp_path / "pipe.py").write_text(PIPELINE)
    lowered = run_qnnctl("lower", "pipe.py", env=shell, cwd=tmp_path)
    assert lowered.returncode == 0, lowered.stderr
    assert f"ROOT={chosen}" in lowered.stdout
    installed = run_qnnctl("install", env=shell)
    assert installed.stdout == f"{chosen}\n", installed.stderr
    setup = subprocess.run([sys.executable, "-c", SETUP], env=shell, capture_output=True, text=True, timeout=60)
    assert f"SETUP={chosen}" in setup.stdout, setup.stderr
    verbose = run_qnnctl("-v", "install", env=shell)
    assert "this shell was set up for it by `qnnctl env`" in verbose.stderr
    # `qnnctl env` itself chooses afresh: that is how a shell switches.
    assert _shell_for(VERSION)["QNN_SDK_ROOT"] == str(default)
    assert mirror.requests == []


def test_the_newest_installed_sdk_comes_before_the_default(mirror: FaultServer, cache_dir: Path,
                                                          tmp_path: Path) -> None:
    newest = install_tree_into_cache(cache_dir, "2.51.0.260929")
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    exported = _shell_for_default()
    assert exported["QNN_SDK_ROOT"] == str(newest)
    (tmp_path / "pipe.py").write_text(PIPELINE)
    lowered = run_qnnctl("lower", "pipe.py", cwd=tmp_path)
    assert f"ROOT={newest}" in lowered.stdout, lowered.stderr
    import json

    report = json.loads(run_qnnctl("doctor", "--json", "--offline").stdout)
    selection = next(c for c in report["checks"] if c["id"] == "sdk.selection")
    assert selection["detail"].startswith("installed: the newest SDK already installed; 2.51.0.260929")
    assert selection["hint"] == "pin it for this project so that it stays the choice: `qnnctl use 2.51.0.260929`"
    assert mirror.requests == []  # nothing downloaded: 2.37, the default, is not wanted


def _shell_for_default() -> dict[str, str]:
    import json

    exported = run_qnnctl("env", "--shell", "json")
    assert exported.returncode == 0, exported.stderr
    return {k: v for k, v in json.loads(exported.stdout).items() if v is not None}


def test_lower_dry_run_installs_nothing_and_says_what_it_would(mirror: FaultServer, cache_dir: Path,
                                                                tmp_path: Path) -> None:
    (tmp_path / "pipe.py").write_text(PIPELINE)
    planned = run_qnnctl("lower", "--dry-run", "--sdk", "2.37.1.250807", "pipe.py", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    root = cache_dir / "sdks" / "2.37.1.250807"
    note = (f"SDK 2.37.1.250807 is not installed (given as 2.37.1.250807): without --dry-run, qnnctl would "
            f"first download it from {mirror.base}/2.37.1.250807/v2.37.1.250807.zip and install it into {root}")
    assert planned.stdout.startswith(f"# {note}\n")
    assert note in planned.stderr
    assert f"export QNN_SDK_ROOT='{root}'" in planned.stdout
    # The mirror's index.json is read, as install reads it first to decide; no archive is fetched.
    assert [r.path for r in mirror.requests] == ["/index.json"]
    assert not root.exists()


def test_install_sha256_of_an_installed_sdk_is_checked(mirror: FaultServer, cache_dir: Path) -> None:
    first = run_qnnctl("install", VERSION)
    assert first.returncode == 0, first.stderr
    import json

    recorded = json.loads((cache_dir / "sdks" / VERSION / ".qnnctl.json").read_text())["sha256"]
    served = len(mirror.requests)
    assert run_qnnctl("install", VERSION, "--sha256", recorded).returncode == 0
    wrong = run_qnnctl("install", VERSION, "--sha256", "0" * 64)
    assert wrong.returncode == 4, wrong.stderr
    assert f"installed from an archive whose sha256 is {recorded}, not {'0' * 64}" in wrong.stderr
    assert "already installed" not in wrong.stderr
    assert (cache_dir / "sdks" / VERSION / ".qnnctl.json").is_file()  # nothing changed
    assert len(mirror.requests) == served


# -- the pieces of the choice, in-process ---------------------------------------------------


def _pin(text: str) -> Path:
    pin = Path.cwd() / ".qnn-version"
    pin.write_text(text)
    return pin


@pytest.mark.parametrize("text", ["2.37.0.250724 # the one # ExecuTorch 1.5 pins\n",
                                  "# a comment\n\n  2.37.0.250724  \n2.34.0.250424\n"])
def test_a_pin_is_read_to_its_first_version(text: str) -> None:
    from qnnctl.sdk.select import read_pin

    assert read_pin(_pin(text)) == VERSION


def test_a_pin_that_names_no_version_says_so() -> None:
    from qnnctl.errors import UsageError
    from qnnctl.sdk.select import read_pin

    pin = _pin("# nothing yet\n")
    with pytest.raises(UsageError) as caught:
        read_pin(pin)
    assert (caught.value.message, caught.value.hint) == (
        f"{pin} names no version", "write a version such as 2.37.0.250724 into it")


@pytest.mark.parametrize(("content", "message"), [
    (b"latest\n", "{pin}: "), (b"\xff\xfe2.37\n", "cannot read the pin {pin}: "),
], ids=["not-a-version", "not-text"])
def test_a_bad_pin_is_named_with_the_fix(content: bytes, message: str) -> None:
    from qnnctl.errors import UsageError
    from qnnctl.sdk.select import read_pin

    pin = Path.cwd() / ".qnn-version"
    pin.write_bytes(content)
    with pytest.raises(UsageError) as caught:
        read_pin(pin)
    assert caught.value.message.startswith(message.format(pin=pin))
    assert caught.value.hint == "fix it, or rewrite it with `qnnctl use VERSION`"


def test_the_callers_libraries_are_the_folder_with_libqnnhtp(tmp_path: Path) -> None:
    from qnnctl.sdk.select import caller_lib_dir

    system_only = tmp_path / "system-only"
    system_only.mkdir()
    (system_only / "libQnnSystem.so").write_bytes(b"")
    sdk = build_sdk_tree(tmp_path / "sdk")
    lib = sdk / "lib" / "x86_64-linux-clang"
    assert caller_lib_dir({"LD_LIBRARY_PATH": f":{system_only}:{lib}"}) == lib
    assert caller_lib_dir({"LD_LIBRARY_PATH": str(system_only)}) is None
    # Unset or empty, LD_LIBRARY_PATH names no folder: none under the working folder is looked in
    # (XXXX stands for any name a fallback could make up).
    for name in ("", "XXXX"):
        (Path.cwd() / name).mkdir(exist_ok=True)
        (Path.cwd() / name / "libQnnHtp.so").write_bytes(b"")
    assert caller_lib_dir({}) is None
    assert caller_lib_dir({"LD_LIBRARY_PATH": ""}) is None


@pytest.mark.parametrize("where", ["cache", "elsewhere", "unnamed"])
def test_a_shells_sdk_that_has_gone_is_named(tmp_path: Path, where: str) -> None:
    """Only an SDK of qnnctl's cache is put back where it was by `qnnctl install VERSION`."""
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import shell_sdk_gone

    cache = Cache(tmp_path / "cache")
    root = {"cache": cache.sdks / VERSION, "elsewhere": tmp_path / "opt" / VERSION,
            "unnamed": tmp_path / "qairt-current"}[where]
    error = shell_sdk_gone(root, cache)
    assert error.message == f"this shell was set up by `qnnctl env` for the SDK at {root}, which is gone"
    assert error.exit_code == 1
    assert error.version == (str(root) if where == "unnamed" else VERSION)
    again = f"`qnnctl install {VERSION}` to put it back, or " if where == "cache" else ""
    assert error.hint == f'{again}`eval "$(qnnctl env)"` to set the shell up for another SDK'


def test_the_newest_installed_counts_executorchs_cache_and_no_damaged_sdk(cache_dir: Path, tmp_path: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import newest_installed

    cache = Cache(cache_dir)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    damaged = install_tree_into_cache(cache_dir, "2.50.0.260828")
    (damaged / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").unlink()
    staging = tmp_path / "staging"
    environ = {"QNN_STAGING_DIR": str(staging), "HOME": os.environ["HOME"]}
    assert newest_installed(cache, environ) == OTHER_VERSION  # the damaged 2.50 is not counted
    build_sdk_tree(staging / "sdk-2.45.0.260326", SdkSpec(version="2.45.0.260326"))
    build_sdk_tree(staging / "sdk-2.49.0.260730.partial")  # not a version
    (staging / "sdk-2.48.0.260626").mkdir()  # no SDK inside
    assert newest_installed(cache, environ) == "2.45.0.260326"
    home_cache = Path(os.environ["HOME"]) / ".cache" / "executorch" / "qnn" / "sdk-2.46.0.260424"
    build_sdk_tree(home_cache, SdkSpec(version="2.46.0.260424"))
    assert newest_installed(cache, environ) == "2.46.0.260424"


def test_executorchs_cache_is_where_its_downloader_puts_it() -> None:
    from qnnctl.sdk.select import executorch_cache_dirs

    assert executorch_cache_dirs(VERSION, {"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg"}) == [
        Path(f"/xdg/executorch/qnn/sdk-{VERSION}")]
    assert executorch_cache_dirs(VERSION, {"HOME": "/home/u", "XDG_CACHE_HOME": ""}) == [
        Path(f"/home/u/.cache/executorch/qnn/sdk-{VERSION}")]
    assert executorch_cache_dirs(VERSION, {"HOME": "/home/u", "QNN_STAGING_DIR": "/staging"}) == [
        Path(f"/staging/sdk-{VERSION}"), Path(f"/home/u/.cache/executorch/qnn/sdk-{VERSION}")]
    assert executorch_cache_dirs(VERSION, {}) == [Path(f"~/.cache/executorch/qnn/sdk-{VERSION}").expanduser()]


def test_a_choice_is_described_by_its_version_its_folder_or_the_caller() -> None:
    assert Selection("pin", "pinned in /p/.qnn-version", version=VERSION).describe() == (
        f"SDK {VERSION} (pinned in /p/.qnn-version)")
    assert Selection("env", "from QNN_SDK_ROOT", root=Path("/opt/qairt")).describe() == (
        "SDK /opt/qairt (env: from QNN_SDK_ROOT)")
    assert Selection("caller", "QNN_SDK_ROOT is exported but empty").describe() == (
        "SDK left to the caller (caller: QNN_SDK_ROOT is exported but empty)")


def test_the_newest_installed_is_the_highest_version_not_the_last_in_text_order(cache_dir: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import newest_installed

    install_tree_into_cache(cache_dir, "2.9.0.230207")
    install_tree_into_cache(cache_dir, "2.10.0.230425")  # "2.10" < "2.9" as text
    assert newest_installed(Cache(cache_dir), {"HOME": os.environ["HOME"]}) == "2.10.0.230425"


def test_a_dangling_link_is_not_the_newest_installed(cache_dir: Path, tmp_path: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import newest_installed
    from qnnctl.sdk.stores import link_sdk

    cache = Cache(cache_dir)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    gone = build_sdk_tree(tmp_path / "vendor" / "2.51.0.260929", SdkSpec(version="2.51.0.260929"))
    kept = build_sdk_tree(tmp_path / "vendor" / "2.45.0.260326", SdkSpec(version="2.45.0.260326"))
    link_sdk(gone, None, cache, dict(os.environ))
    link_sdk(kept, None, cache, dict(os.environ))
    assert newest_installed(cache, dict(os.environ)) == "2.51.0.260929"
    from qnnctl.sdk.select import find_installed
    from qnnctl.sdk.stores import LINK_ORIGIN

    assert find_installed("2.45.0.260326", cache, dict(os.environ)) == Sdk(kept, "2.45.0.260326", LINK_ORIGIN)
    import shutil

    shutil.rmtree(gone)
    assert newest_installed(cache, dict(os.environ)) == "2.45.0.260326"
    # Asked for by its version, the SDK linked to a folder that has gone is named as such.
    from qnnctl.errors import NotInstalledError
    from qnnctl.sdk.select import resolve_installed

    with pytest.raises(NotInstalledError) as caught:
        resolve_installed(Selection(BY_PIN, "pinned", version="2.51.0.260929"), cache, dict(os.environ))
    assert caught.value.message == (f"SDK 2.51.0.260929 is linked to {gone}, which is gone "
                                    "(or is no SDK root any more)")


def test_an_sdk_in_a_store_is_found_and_a_link_comes_first(cache_dir: Path, tmp_path: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import find_installed
    from qnnctl.sdk.stores import link_sdk

    cache, version = Cache(cache_dir), "2.45.0.260326"
    store = tmp_path / "store"
    stored = build_sdk_tree(store / version, SdkSpec(version=version))
    environ = {**os.environ, "QNNCTL_STORES": str(store)}
    assert find_installed(version, cache, environ) == Sdk(stored, version, f"store {store}")
    from qnnctl.run.environment import resolve_sdk

    assert resolve_sdk(version, environ, Path.cwd(), cache, allow_install=False)[1] == Sdk(stored, version,
                                                                                         f"store {store}")
    linked = build_sdk_tree(tmp_path / "vendor" / version, SdkSpec(version=version))
    link_sdk(linked, None, cache, environ)
    assert find_installed(version, cache, environ).root == linked  # type: ignore[union-attr]


def test_a_link_record_renamed_by_hand_is_no_link(cache_dir: Path, tmp_path: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import find_installed, newest_installed
    from qnnctl.sdk.stores import link_sdk

    cache = Cache(cache_dir)
    install_tree_into_cache(cache_dir, OTHER_VERSION)
    folder = build_sdk_tree(tmp_path / "vendor" / "2.45.0.260326", SdkSpec(version="2.45.0.260326"))
    link, _ = link_sdk(folder, None, cache, dict(os.environ))
    link.record.rename(link.record.with_name("2.40.0.251030.json"))
    # Neither the version it holds (which no look-up would find) nor the one its name says.
    assert newest_installed(cache, dict(os.environ)) == OTHER_VERSION
    assert find_installed("2.40.0.251030", cache, dict(os.environ)) is None
    assert find_installed("2.45.0.260326", cache, dict(os.environ)) is None
    # So a dry run plans for the SDK a real run would choose, not one it says is installed.
    selection, sdk, notes = _dry_run()
    assert selection.detail == "the newest SDK already installed"
    assert sdk == Sdk(root=cache_dir / "sdks" / OTHER_VERSION, version=OTHER_VERSION, origin="qnnctl cache")
    assert notes == []
    # As a real run that may not install resolves it.
    from qnnctl.run.environment import resolve_sdk

    chosen, found = resolve_sdk(None, dict(os.environ), Path.cwd(), cache, allow_install=False)
    assert (chosen.detail, found) == (selection.detail, sdk)


# -- a dry run: what would be fetched, in words ----------------------------------------------


def _dry_run(spec: str | None = None, allow_install: bool = True, **environ: str) -> tuple[Selection, Sdk | None,
                                                                                           list[str]]:
    from qnnctl.run.environment import resolve_for_dry_run
    from qnnctl.sdk.cache import Cache

    cache = Cache(Path(os.environ["QNNCTL_CACHE_DIR"]))
    return resolve_for_dry_run(spec, {**os.environ, **environ}, Path.cwd(), cache, allow_install)


def test_a_dry_run_of_an_sdk_that_is_not_installed(cache_dir: Path) -> None:
    _, sdk, notes = _dry_run(VERSION)
    root = cache_dir / "sdks" / VERSION
    assert sdk == Sdk(root=root, version=VERSION, origin="not installed yet")
    url = ("https://softwarecenter.qualcomm.com/api/download/software/sdks/Qualcomm_AI_Runtime_Community/All/"
           f"{VERSION}/v{VERSION}.zip")
    assert notes == [f"SDK {VERSION} is not installed (given as {VERSION}): without --dry-run, qnnctl would "
                     f"first download it from {url} and install it into {root}"]
    # Unless told otherwise, a dry run plans for a run that may install.
    from qnnctl.run.environment import resolve_for_dry_run
    from qnnctl.sdk.cache import Cache

    assert resolve_for_dry_run(VERSION, os.environ, Path.cwd(), Cache(cache_dir))[2] == notes


def test_a_dry_run_names_the_mirror_without_its_password(cache_dir: Path, server: FaultServer) -> None:
    from qnnctl.errors import DownloadError

    base = server.base.replace("http://", "http://me:secret@")
    _, _, notes = _dry_run(VERSION, QNNCTL_MIRROR=f"{base}/qairt/")
    shown = server.base.replace("http://", "http://***@")
    assert notes[0].endswith(f"download it from {shown}/qairt/{VERSION}/v{VERSION}.zip "
                             f"and install it into {cache_dir / 'sdks' / VERSION}")
    # A mirror that cannot be reached stops the dry run where it stops install: named without it too.
    with pytest.raises(DownloadError) as caught:
        _dry_run(VERSION, QNNCTL_MIRROR="http://me:secret@127.0.0.1:9/qairt/")
    assert "http://***@127.0.0.1:9/qairt/index.json" in caught.value.message
    assert "secret" not in caught.value.message


@pytest.mark.parametrize("mirror", ["ftp://mirror.example/", "file:///srv/mirror/"])
def test_a_dry_run_checks_the_mirror_as_a_real_run_would(cache_dir: Path, mirror: str) -> None:
    from qnnctl.errors import UsageError

    # Over HTTP(S) only: a mirror is no place for a file: URL (that is `install --file`).
    with pytest.raises(UsageError) as caught:
        _dry_run(VERSION, QNNCTL_MIRROR=mirror)
    scheme = mirror.split(":", 1)[0]
    assert caught.value.message == f"QNNCTL_MIRROR {mirror}: qnnctl downloads over https or http, not {scheme}:"
    assert caught.value.hint == "an archive on disk is installed with `qnnctl install --file ARCHIVE`"


def test_a_dry_run_of_a_damaged_sdk_says_damaged(cache_dir: Path) -> None:
    root = install_tree_into_cache(cache_dir, VERSION)
    (root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").unlink()
    (root / "lib" / "x86_64-linux-clang" / "libQnnSystem.so").unlink()
    notes = _dry_run(VERSION)[2]
    assert notes == [f"SDK {VERSION} is damaged (missing lib/x86_64-linux-clang/libQnnHtp.so, "
                     f"lib/x86_64-linux-clang/libQnnSystem.so) (given as "
                     f"{VERSION}): without --dry-run, qnnctl would first download it from "
                     f"https://softwarecenter.qualcomm.com/api/download/software/sdks/"
                     f"Qualcomm_AI_Runtime_Community/All/{VERSION}/v{VERSION}.zip and install it into {root}"]


def test_a_dry_run_that_may_not_install_raises_not_installed(cache_dir: Path) -> None:
    from qnnctl.errors import DamagedSdkError, NotInstalledError

    with pytest.raises(NotInstalledError) as caught:
        _dry_run(VERSION, allow_install=False)
    assert type(caught.value) is NotInstalledError
    root = install_tree_into_cache(cache_dir, VERSION)
    (root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").unlink()
    with pytest.raises(DamagedSdkError) as damaged:
        _dry_run(VERSION, allow_install=False)
    assert (damaged.value.root, damaged.value.missing) == (str(root), ["lib/x86_64-linux-clang/libQnnHtp.so"])
    assert damaged.value.message == (f"SDK {VERSION} in qnnctl's cache is damaged: {root} is missing "
                                     "lib/x86_64-linux-clang/libQnnHtp.so")


def test_a_dry_run_of_an_installed_sdk_has_nothing_to_say(cache_dir: Path) -> None:
    from qnnctl.sdk.select import BY_ARGUMENT

    root = install_tree_into_cache(cache_dir, VERSION)
    selection, sdk, notes = _dry_run(VERSION)
    assert selection.reason == BY_ARGUMENT
    assert sdk is not None
    assert sdk.root == root
    assert notes == []


def _partial(cache_dir: Path, components: list[str]) -> Path:
    import json

    root = install_tree_into_cache(cache_dir, VERSION)
    manifest = json.loads((root / ".qnnctl.json").read_text())
    (root / ".qnnctl.json").write_text(json.dumps({**manifest, "components": components, "partial": True}))
    return root


def test_a_dry_run_names_the_components_a_pin_asks_for_and_the_sdk_lacks(cache_dir: Path) -> None:
    from qnnctl.errors import MissingComponentError

    root = _partial(cache_dir, ["host"])
    pin = _pin(f"{VERSION}\nhost,android,docs\n")
    _, sdk, notes = _dry_run()
    assert sdk is not None
    assert sdk.root == root
    assert notes == [f"SDK {VERSION} lacks android, docs, which the pin in {pin} names: without --dry-run, "
                     f"qnnctl would first fetch only those (`qnnctl install {VERSION} --components android,docs`)"]
    with pytest.raises(MissingComponentError) as caught:
        _dry_run(allow_install=False)
    assert caught.value.components == ("android", "docs")
    assert caught.value.message == (f"SDK {VERSION} at {root} was installed without android, docs, which the pin "
                                    f"in {pin} needs")
    # All that the pin asks for is there, or it asks for nothing: nothing to say.
    _pin(f"{VERSION}\nhost\n")
    assert _dry_run()[2] == []
    _pin(f"{VERSION}\n")
    assert _dry_run()[2] == []
    assert _dry_run(allow_install=False)[1] == sdk


def test_env_exports_an_sdk_that_lacks_pinned_components_and_says_what_adds_them(cache_dir: Path) -> None:
    """env never downloads: it exports what is there, and names the components the pin asks
    for that the SDK lacks, with the command that adds them."""
    from qnnctl.run.envplan import plan_env
    from qnnctl.sdk.cache import Cache

    root = _partial(cache_dir, ["host"])
    pin = _pin(f"{VERSION}\nhost,android,docs\n")
    plan = plan_env(None, dict(os.environ), Path.cwd(), Cache(cache_dir))
    assert plan.selection == Selection(BY_PIN, f"pinned in {pin}", version=VERSION)
    assert plan.values["QNN_SDK_ROOT"] == str(root)
    assert plan.notes == (f"SDK {VERSION} lacks android, docs, which the pin in {pin} names; "
                          f"`qnnctl install {VERSION} --components android,docs` adds them",)
    _pin(f"{VERSION}\nhost,docs\n")
    assert plan_env(None, dict(os.environ), Path.cwd(), Cache(cache_dir)).notes[0].endswith(
        f"`qnnctl install {VERSION} --components docs` adds it")
    _pin(f"{VERSION}\nhost\n")
    assert plan_env(None, dict(os.environ), Path.cwd(), Cache(cache_dir)).notes == ()


def test_an_sdk_that_may_not_be_completed_is_refused_for_the_components_its_pin_names(cache_dir: Path) -> None:
    """As `which` and `lower` resolve when they may not install: the pin's components are
    checked by default, and the error names the SDK, its folder, what is missing, and the command."""
    from qnnctl.errors import MissingComponentError
    from qnnctl.run.environment import resolve_sdk
    from qnnctl.sdk.cache import Cache

    root = _partial(cache_dir, ["host"])
    pin = _pin(f"{VERSION}\nhost,android\n")
    cache = Cache(cache_dir)
    with pytest.raises(MissingComponentError) as caught:
        resolve_sdk(None, dict(os.environ), Path.cwd(), cache, allow_install=False)
    assert (caught.value.version, caught.value.root, caught.value.components) == (VERSION, str(root), ("android",))
    assert caught.value.message == (f"SDK {VERSION} at {root} was installed without android, which the pin "
                                    f"in {pin} needs")
    assert caught.value.hint == (f"add it: `qnnctl install {VERSION} --components android` "
                                 "(fetches only what is missing)")


def test_a_look_up_that_may_not_install_refuses_an_sdk_without_the_pinned_components(cache_dir: Path) -> None:
    from qnnctl.errors import MissingComponentError
    from qnnctl.run.which import which
    from qnnctl.sdk.cache import Cache

    root = _partial(cache_dir, ["host"])
    pin = _pin(f"{VERSION}\nhost,android\n")
    cache = Cache(Path(os.environ["QNNCTL_CACHE_DIR"]))
    with pytest.raises(MissingComponentError) as caught:
        which("libQnnHtp.so", None, os.environ, Path.cwd(), cache)
    assert (caught.value.message, caught.value.hint) == (
        f"SDK {VERSION} at {root} was installed without android, which the pin in {pin} needs",
        f"add it: `qnnctl install {VERSION} --components android` (fetches only what is missing)",
    )
    _pin(f"{VERSION}\nhost\n")
    assert which("libQnnHtp.so", None, os.environ, Path.cwd(), cache).sdk == Sdk(root, VERSION, "qnnctl cache")


def test_a_dry_run_says_what_runtime_it_would_stage(cache_dir: Path, tmp_path: Path) -> None:
    from qnnctl.host.needs import missing_host_libraries

    if missing_host_libraries(["libc++.so.1", "libc++abi.so.1"], []) != ["libc++.so.1", "libc++abi.so.1"]:
        pytest.skip("this host has libc++.so.1 or libc++abi.so.1")
    from tests.sdkfactory import compile_shared

    root = install_tree_into_cache(cache_dir, VERSION)
    lib = root / "lib" / "x86_64-linux-clang"
    stubs = [compile_shared(tmp_path / "stub" / name, f"int {function}(void) {{ return 1; }}\n",
                            [f"-Wl,-soname,{name}"])
             for name, function in (("libc++.so.1", "cxx"), ("libc++abi.so.1", "cxxabi"))]
    compile_shared(lib / "libQnnHtp.so", "int cxx(void);\nint cxxabi(void);\n"
                   "int qnn(void) { return cxx() + cxxabi(); }\n",
                   ["-Wl,-soname,libQnnHtp.so", *map(str, stubs)])
    for stub in stubs:
        stub.unlink()
    _, _, notes = _dry_run(VERSION)
    assert notes == ["the SDK's libraries need libc++.so.1, libc++abi.so.1, which this host lacks: without "
                     "--dry-run, qnnctl would stage them first (what `qnnctl install --runtime` does)"]
    assert _dry_run(VERSION, allow_install=False)[2] == []  # a run that may not install stages nothing


def test_an_sdk_whose_trio_the_host_has_stages_nothing_and_loads_no_staging_code(
        cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `lower` asks before every run: an SDK whose libraries need the libc++ trio, on a host
    that has it (here in the SDK's own folder, as releases before 2.23 ship it), stages nothing and
    never imports the staging code (requests, the package readers)."""
    import qnnctl.host
    from qnnctl.host.needs import trio_needed
    from qnnctl.run.environment import ensure_loadable
    from qnnctl.sdk.cache import Cache
    from tests.host.test_runtime import stub_trio
    from tests.sdkfactory import compile_shared

    root = install_tree_into_cache(cache_dir, VERSION)
    lib = root / "lib" / "x86_64-linux-clang"
    stub_trio(lib)
    compile_shared(lib / "libQnnHtp.so", "int libcxx_stub(void);\nint qnn_htp(void) { return libcxx_stub(); }\n",
                   extra=[f"-L{lib}", "-Wl,--no-as-needed", "-l:libc++.so.1"])
    sdk = Sdk(root, VERSION, "qnnctl cache")
    assert trio_needed(sdk) == ["libc++.so.1"]
    monkeypatch.delitem(sys.modules, "qnnctl.host.runtime", raising=False)
    monkeypatch.delattr(qnnctl.host, "runtime", raising=False)
    ensure_loadable(sdk, dict(os.environ), Cache(cache_dir), Path.cwd())
    assert "qnnctl.host.runtime" not in sys.modules
    assert not (cache_dir / "runtime").exists()


def test_the_staged_runtime_is_held_to_the_lock_of_the_sdk_it_is_loaded_with(cache_dir: Path, tmp_path: Path) -> None:
    """`lower` and `setup_sdk()` hold a staged runtime to what the project's lock pins of it, for the
    SDK they load it with; with none staged the lock is not read for it (here a lock that is no
    TOML, which reading would refuse)."""
    from qnnctl.errors import IntegrityError
    from qnnctl.host.build import staged_files
    from qnnctl.host.runtime import RuntimeRequest, stage_runtime
    from qnnctl.run.environment import hold_runtime_to_lock
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.lockfile import LockedSdk, LockError, write_lock
    from tests.host.test_runtime import stub_trio

    cache = Cache(cache_dir)
    sdk = Sdk(install_tree_into_cache(cache_dir, VERSION), VERSION, "qnnctl cache")
    lock = Path.cwd() / "qnnctl.lock"
    lock.write_text("[sdk\n")
    hold_runtime_to_lock(sdk, cache, Path.cwd())  # nothing staged: nothing read
    stub_trio(tmp_path / "given")
    staged = stage_runtime(cache, None, RuntimeRequest(sources=(tmp_path / "given",), force=True, use_apt=False),
                           os.environ).libcxx
    assert staged is not None
    with pytest.raises(LockError) as unread:
        hold_runtime_to_lock(sdk, cache, Path.cwd())
    assert unread.value.message.startswith(f"{lock} is not TOML: ")
    lock.unlink()
    hold_runtime_to_lock(sdk, cache, Path.cwd())  # staged, and no lock: nothing to hold it to

    files = staged_files(staged)
    other = {**files, "lib/libc++.so.1": "0" * 64}

    def locked(version: str, pinned: dict[str, str]) -> None:
        write_lock(lock, LockedSdk(lock, version, "a" * 64, runtime_sha256={"libcxx": pinned}), "trusted")

    locked(VERSION, files)
    hold_runtime_to_lock(sdk, cache, Path.cwd() / "src")  # the one it pins
    locked(OTHER_VERSION, other)
    hold_runtime_to_lock(sdk, cache, Path.cwd())  # a lock of another SDK pins nothing of this one's
    locked(VERSION, other)
    with pytest.raises(IntegrityError) as refused:
        hold_runtime_to_lock(sdk, cache, Path.cwd())
    assert refused.value.message == (
        f"the runtime staged in {staged.root} is not the libcxx runtime {lock} pins: "
        f"lib/libc++.so.1: {files['lib/libc++.so.1']}, pinned {'0' * 64}")


def test_a_resolve_for_a_terminal_shows_the_download_as_a_bar(mirror: FaultServer, cache_dir: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    """`qnnctl lower` on a terminal passes terminal=True: the install's download draws a bar."""
    from qnnctl.run.environment import resolve_sdk
    from qnnctl.sdk.cache import Cache

    _, sdk = resolve_sdk(VERSION, dict(os.environ), Path.cwd(), Cache(cache_dir), terminal=True)
    assert sdk is not None
    assert sdk.root == cache_dir / "sdks" / VERSION
    out, err = capfd.readouterr()
    assert out == ""
    assert "\r" in err  # the bar redraws its line


def test_an_sdk_named_by_path_says_where_the_path_came_from() -> None:
    from qnnctl.sdk.select import BY_ARGUMENT, BY_ENV, BY_SHELL, selection_origin

    root = Path("/opt/qairt/2.37.0.250724")
    assert selection_origin(Selection(BY_ENV, "from QNN_SDK_ROOT", root=root)) == "QNN_SDK_ROOT"
    assert selection_origin(Selection(BY_SHELL, "set up by qnnctl env", root=root)) == "qnnctl env"
    assert selection_origin(Selection(BY_ARGUMENT, "given", root=root)) == "--sdk"


def test_an_sdk_named_by_path_is_the_version_its_libraries_were_built_as(tmp_path: Path) -> None:
    """sdk.yaml and the folder's name say 2.37; the libraries carry the build of 2.51: they win."""
    from qnnctl.sdk.layout import sdk_from_root

    root = build_sdk_tree(tmp_path / VERSION, SdkSpec(version=VERSION, build_id="v2.51.0.260929181845"))
    assert sdk_from_root(root, "--sdk") == Sdk(root=root, version="2.51.0.260929", origin="--sdk")


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_spec_is_refused(tmp_path: Path, spec: str) -> None:
    from qnnctl.sdk.select import select_sdk

    with pytest.raises(UsageError) as caught:
        select_sdk(spec, {}, tmp_path)
    assert caught.value.message == "an empty string is neither an SDK version nor a path"


def test_an_sdk_root_of_blanks_is_refused_as_empty(tmp_path: Path) -> None:
    from qnnctl.errors import UsageError
    from qnnctl.sdk.layout import sdk_from_root

    with pytest.raises(UsageError) as caught:
        sdk_from_root(Path("  "), "QNN_SDK_ROOT")
    assert caught.value.message == "QNN_SDK_ROOT is empty; an SDK root must be a folder"


def test_an_sdk_named_by_path_with_no_version_anywhere_is_of_version_unknown(tmp_path: Path) -> None:
    from qnnctl.sdk.layout import sdk_from_root

    root = build_sdk_tree(tmp_path / "unpacked", SdkSpec(sdk_yaml=False))
    assert sdk_from_root(root, "QNN_SDK_ROOT") == Sdk(root=root, version="unknown", origin="QNN_SDK_ROOT")


def test_sdk_yaml_with_a_byte_that_is_not_utf8_still_names_the_version(tmp_path: Path) -> None:
    """A vendor's comment in another encoding: the version line is read all the same."""
    from qnnctl.sdk.layout import version_claims

    root = build_sdk_tree(tmp_path / "unpacked", SdkSpec(sdk_yaml=False))
    (root / "sdk.yaml").write_bytes(b"# \xe9dition Qualcomm\nversion: " + VERSION.encode() + b"\n")
    assert version_claims(root) == {"sdk.yaml": VERSION}


def test_sdk_yaml_is_read_no_further_than_its_first_lines(tmp_path: Path) -> None:
    """An archive's sdk.yaml may inflate to gigabytes (1 GiB from a 1 MB zip took 2 GB of memory
    at `install --file`): its version is read from its first 64 KiB, the rest left unread."""
    import tracemalloc

    from qnnctl.sdk.layout import version_claims

    root = build_sdk_tree(tmp_path / "unpacked", SdkSpec(sdk_yaml=False))
    with open(root / "sdk.yaml", "wb") as yaml:
        yaml.write(b"version: " + VERSION.encode() + b"\n")
        yaml.truncate(256 << 20)  # a sparse file: nothing on the disk, 256 MiB to read
    tracemalloc.start()
    try:
        assert version_claims(root) == {"sdk.yaml": VERSION}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    # A version past them names nothing.
    with open(root / "sdk.yaml", "wb") as yaml:
        yaml.write(b"#" * (64 << 10) + b"\nversion: " + VERSION.encode() + b"\n")
    assert version_claims(root) == {}


def test_a_folder_that_is_no_sdk_root_is_refused_with_where_it_was_named(tmp_path: Path) -> None:
    from qnnctl.errors import InvalidSdkError
    from qnnctl.sdk.layout import sdk_from_root

    (tmp_path / "QNN_README.txt").write_text("")
    with pytest.raises(InvalidSdkError) as caught:
        sdk_from_root(tmp_path, "QNN_SDK_ROOT")
    assert caught.value.message.startswith(f"QNN_SDK_ROOT {tmp_path} is not a QNN SDK root: missing ")
    assert caught.value.hint == ("point it at the folder that holds QNN_README.txt, lib/ and bin/, or unset it "
                                 "and run `qnnctl install`")


def test_what_names_an_sdks_version_besides_its_libraries_in_the_order_trusted(tmp_path: Path) -> None:
    """sdk.yaml, the folder's name, the manifest, the name of the archive the manifest names."""
    import json

    from qnnctl.sdk.layout import version_claims

    root = build_sdk_tree(tmp_path / "2.31.0.250130", SdkSpec(version=VERSION))
    # The mirror's layout: the file's name is read, not the folder it is in.
    manifest = {"version": OTHER_VERSION, "source": "https://mirror.example/2.26.0.240828/v2.28.0.241029.zip"}
    (root / ".qnnctl.json").write_text(json.dumps(manifest))
    expected = {"sdk.yaml": VERSION, "the folder name": "2.31.0.250130", "the manifest": OTHER_VERSION,
                "the archive's name": "2.28.0.241029"}
    assert list(version_claims(root).items()) == list(expected.items())
    # A manifest the caller has read already is the one used.
    assert version_claims(root, {"version": "2.26.0.240828"})["the manifest"] == "2.26.0.240828"
    # A version in the manifest that is no full version claims nothing.
    assert "the manifest" not in version_claims(root, {"version": "2.26"})
    # Nothing on disk names it: no claims.
    bare = build_sdk_tree(tmp_path / "unpacked", SdkSpec(sdk_yaml=False))
    assert version_claims(bare) == {}


# -- a folder named as an SDK root that is none, told in its own words --------------------------


def _host_libraries(root: Path, *lib_dirs: str) -> Path:
    """A folder with the two libraries that make an SDK root for each host of `lib_dirs`."""
    for lib_dir in lib_dirs:
        (root / lib_dir).mkdir(parents=True)
        for name in ("libQnnHtp.so", "libQnnSystem.so"):
            (root / lib_dir / name).write_bytes(b"")
    return root


X86_LIBS, ARM_LIBS = "lib/x86_64-linux-clang", "lib/aarch64-oe-linux-gcc11.2"
ROOT_HINT = ("an SDK root is the folder that holds QNN_README.txt, lib/ and bin/ (an SDK archive is installed with "
             "`qnnctl install --file ARCHIVE`)")


def _not_a_root(root: Path, origin: str) -> tuple[str, str | None]:
    from qnnctl.sdk.layout import missing_layout, not_an_sdk_root

    missing = missing_layout(root)
    error = not_an_sdk_root(root, missing, origin)
    assert (error.root, error.missing, error.origin) == (str(root), missing, origin)  # for a caller to read
    return error.message, error.hint


def test_a_path_named_as_an_sdk_root_that_is_not_there_or_is_a_file(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    assert _not_a_root(gone, "--sdk") == (
        f"--sdk {gone} does not exist",
        "give the path of an SDK root: the folder that holds QNN_README.txt, lib/ and bin/ (qairt/<version>/ "
        "where Qualcomm's archive was unpacked)")
    archive = tmp_path / "v2.37.0.250724.zip"
    archive.write_bytes(b"PK")
    assert _not_a_root(archive, "QNN_SDK_ROOT") == (f"QNN_SDK_ROOT {archive} is a file, not a folder", ROOT_HINT)


@pytest.mark.parametrize(("forced", "has", "lacks"), [
    ("x86_64", ARM_LIBS, "Linux aarch64 (lib/aarch64-oe-linux-gcc11.2/) only, none for this Linux x86_64 host "
     "(lib/x86_64-linux-clang/)"),
    ("aarch64", X86_LIBS, "Linux x86_64 (lib/x86_64-linux-clang/) only, none for this Linux aarch64 host "
     "(lib/aarch64-oe-linux-gcc11.2/)"),
])
def test_an_sdk_with_another_hosts_libraries_only_says_which_it_has(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    forced: str, has: str, lacks: str) -> None:
    from qnnctl.sdk.hosts import HOSTS, this_host
    from qnnctl.sdk.layout import hosts_of

    monkeypatch.setenv("QNNCTL_FORCE_MACHINE", forced)
    root = _host_libraries(tmp_path / "other-host", has)
    here = this_host()
    assert _not_a_root(root, "--sdk") == (
        f"--sdk {root} has host libraries for {lacks}",
        f"use an SDK with {here.lib_dir}/, or run on one of the hosts it has libraries for")
    assert hosts_of(root) == [h for h in HOSTS if h.lib_dir == has]
    assert hosts_of(_host_libraries(tmp_path / "both", ARM_LIBS, X86_LIBS)) == list(HOSTS)
    assert hosts_of(tmp_path / "both" / "lib") == []


def test_what_an_sdk_with_the_libraries_of_several_other_hosts_lacks() -> None:
    from qnnctl.sdk.hosts import HOSTS
    from qnnctl.sdk.layout import no_libraries_for_this_host

    assert no_libraries_for_this_host(list(HOSTS)) == (
        "has host libraries for Linux x86_64 (lib/x86_64-linux-clang/) and Linux aarch64 "
        "(lib/aarch64-oe-linux-gcc11.2/) only, none for this Linux x86_64 host (lib/x86_64-linux-clang/)")


@pytest.mark.parametrize(("origin", "how"), [
    ("--sdk", "`--sdk {}`"), ("QNN_SDK_ROOT", "`export QNN_SDK_ROOT={}`"), ("the folder", "`qnnctl link {}`"),
    ("qnnctl env", "{}"),
])
def test_a_folder_above_sdk_roots_names_them_as_its_origin_would_be_given(tmp_path: Path, origin: str,
                                                                          how: str) -> None:
    above = tmp_path / "my sdks"
    one = _host_libraries(above / "qairt" / "2.37.0.250724", X86_LIBS)
    missing = f"is not a QNN SDK root: missing {X86_LIBS}/libQnnHtp.so, {X86_LIBS}/libQnnSystem.so"
    quoted = "'" + str(one) + "'"  # a path with a space, as a shell takes it
    message, hint = _not_a_root(above, origin)
    assert (message, hint) == (f"{origin} {above} {missing}", f"an SDK root is below it: {how.format(quoted)}")
    two = _host_libraries(above / "qairt" / "2.34.0.250424", X86_LIBS)
    assert _not_a_root(above, origin)[1] == (
        f"SDK roots are below it: {how.format(chr(39) + str(two) + chr(39))} or {how.format(quoted)}")


def test_a_folder_with_no_sdk_root_below_it_says_what_an_sdk_root_is(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = f"is not a QNN SDK root: missing {X86_LIBS}/libQnnHtp.so, {X86_LIBS}/libQnnSystem.so"
    assert _not_a_root(empty, "--sdk") == (
        f"--sdk {empty} {missing}",
        "an SDK root is the folder that holds QNN_README.txt, lib/ and bin/ (qairt/<version>/ where Qualcomm's "
        "archive was unpacked); an archive is installed with `qnnctl install --file ARCHIVE`")
    assert _not_a_root(empty, "QNN_SDK_ROOT") == (
        f"QNN_SDK_ROOT {empty} {missing}",
        "point it at the folder that holds QNN_README.txt, lib/ and bin/, or unset it and run `qnnctl install`")


def test_sdk_roots_below_a_folder_nearest_first_up_to_a_limit_and_a_depth(tmp_path: Path) -> None:
    from qnnctl.sdk.layout import sdk_roots_below

    top = tmp_path / "top"
    deep = _host_libraries(top / "a" / "b" / "c", X86_LIBS)
    assert sdk_roots_below(top) == [deep]  # three levels down: found
    assert sdk_roots_below(top, depth=2) == []
    too_deep = _host_libraries(tmp_path / "four" / "a" / "b" / "c" / "d", X86_LIBS)
    assert sdk_roots_below(tmp_path / "four") == []
    assert sdk_roots_below(tmp_path / "four", depth=4) == [too_deep]
    # Nearest first, then by name; a root found is not looked into.
    near = _host_libraries(top / "z", X86_LIBS)
    _host_libraries(near / "inner", X86_LIBS)
    mid = [_host_libraries(top / "m" / n, X86_LIBS) for n in ("y", "x")]
    assert sdk_roots_below(top) == [near, mid[1], mid[0]]
    assert sdk_roots_below(top, limit=4) == [near, mid[1], mid[0], deep]
    assert sdk_roots_below(top, limit=1) == [near]
    # A file and a link to a folder are not looked into.
    (top / "file").write_text("")
    _host_libraries(tmp_path / "elsewhere" / "sdk", X86_LIBS)
    (top / "link").symlink_to(tmp_path / "elsewhere")
    assert sdk_roots_below(top, limit=9) == [near, mid[1], mid[0], deep]


def test_a_home_folder_named_by_mistake_is_looked_into_2000_folders_deep_at_most(tmp_path: Path) -> None:
    from qnnctl.sdk.layout import sdk_roots_below

    top = tmp_path / "home"
    for n in range(2000):
        (top / f"{n:04}").mkdir(parents=True)
    root = _host_libraries(top / "1998" / "sdk", X86_LIBS)
    assert sdk_roots_below(top) == [root]  # the home folder and 1999 below it listed
    root.rename(top / "1999" / "sdk")
    assert sdk_roots_below(top) == []  # the 2001st folder is not listed


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user takes root")
def test_a_folder_that_cannot_be_listed_is_passed_over(tmp_path: Path) -> None:
    """As a user who may not enter or list some folders of those below: the others are looked into.

    This process acts as that user (its effective ids, which every permission check asks), then as
    root again: in this process, so that the code that runs meanwhile is this process's, which the
    mutation tool sees (a forked child's calls it does not)."""
    import shutil
    import tempfile

    from qnnctl.sdk.layout import sdk_roots_below

    top = Path(tempfile.mkdtemp(prefix="roots-"))  # in /tmp, which every user may enter
    try:
        top.chmod(0o755)
        (top / "a-closed").mkdir(mode=0o700)  # not to be entered
        _host_libraries(top / "a-closed" / "sdk", X86_LIBS)
        (top / "a-hidden").mkdir(mode=0o711)  # to be entered, not listed
        _host_libraries(top / "a-hidden" / "sdk", X86_LIBS)
        root = _host_libraries(top / "b-open" / "sdk", X86_LIBS)
        for folder in (top / "b-open", root, root / "lib", root / X86_LIBS):
            folder.chmod(0o755)
        groups, gid = os.getgroups(), os.getegid()
        os.setgroups([])
        os.setegid(4321)
        os.seteuid(4321)
        try:
            found = sdk_roots_below(top)
        finally:
            os.seteuid(0)
            os.setegid(gid)
            os.setgroups(groups)
        assert found == [root]
    finally:
        shutil.rmtree(top)


def test_sdk_roots_below_a_folder_are_looked_for_in_so_many_folders_at_most(tmp_path: Path) -> None:
    from qnnctl.sdk.layout import sdk_roots_below

    top = tmp_path / "top"
    for name in ("a", "b", "c"):
        (top / name).mkdir(parents=True)
    root = _host_libraries(top / "c" / "sdk", X86_LIBS)
    # top, a, b, c: four folders listed; the root in c is found by listing c.
    assert sdk_roots_below(top, budget=4) == [root]
    assert sdk_roots_below(top, budget=3) == []
    assert sdk_roots_below(top, budget=0) == []


# -- a linked folder whose libraries changed ---------------------------------------------------


LINK_HINT = ("link the folder again as what it holds (`qnnctl link {root}`), drop the link (`qnnctl uninstall "
             "{version}`), or install a copy into qnnctl's cache, which comes first: `qnnctl install {version} "
             "--force`")


def test_a_linked_folder_is_held_to_the_build_it_was_linked_as(tmp_path: Path) -> None:
    from qnnctl.sdk.select import changed_link_error

    root = build_sdk_tree(tmp_path / "linked", SdkSpec(build_id="v2.37.0.250724101010"))
    assert changed_link_error(VERSION, root, "2.37.0.250724101010") is None
    error = changed_link_error(VERSION, root, "2.37.0.250724999999")
    assert error is not None
    assert (error.message, error.hint, error.exit_code) == (
        f"SDK {VERSION} is linked to {root}, but its libraries are now build 2.37.0.250724101010 (SDK "
        f"{VERSION}), not build 2.37.0.250724999999 as when it was linked; it is not used",
        LINK_HINT.format(root=root, version=VERSION), 4)
    bare = build_sdk_tree(tmp_path / "bare", SdkSpec(build_id=None))
    error = changed_link_error(VERSION, bare, "2.37.0.250724101010")
    assert error is not None
    assert error.message == (f"SDK {VERSION} is linked to {bare}, but its libraries are now a build that carries "
                             "no id, not build 2.37.0.250724101010 as when it was linked; it is not used")


def test_a_linked_folder_without_a_recorded_build_is_held_to_its_version(tmp_path: Path) -> None:
    from qnnctl.sdk.select import changed_link_error, is_build_of

    assert changed_link_error(VERSION, build_sdk_tree(tmp_path / "bare", SdkSpec(build_id=None)), None) is None
    root = build_sdk_tree(tmp_path / "linked", SdkSpec(build_id="v2.51.0.260929181845"))
    assert changed_link_error("2.51.0.260929", root, None) is None
    error = changed_link_error(VERSION, root, None)
    assert error is not None
    assert (error.message, error.hint) == (
        f"SDK {VERSION} is linked to {root}, but its libraries are build 2.51.0.260929181845 (SDK 2.51.0.260929), "
        f"not one of SDK {VERSION}; it is not used", LINK_HINT.format(root=root, version=VERSION))
    # The whole version, not a prefix of it.
    assert changed_link_error("2.51.0.26092", root, None) is not None
    assert is_build_of("2.51.0.260929181845", "2.51.0.260929")
    assert not is_build_of("2.51.0.260929181845", "2.51.0.26092")


# -- a pin read against the versions qnnctl has, and a shell set up for another SDK ------------


def test_a_pins_prefix_is_the_newest_of_the_versions_given_first() -> None:
    from qnnctl.sdk.select import read_pin

    pin = _pin("2.37\n")
    assert read_pin(pin, [("installed", ["2.37.9.990101", "2.37.8.990101"])]) == "2.37.9.990101"
    assert read_pin(pin) != "2.37.9.990101"  # the known releases


def test_a_shell_set_up_for_another_sdk_than_the_pin_is_switched_by_env() -> None:
    from qnnctl.sdk.select import PinConflict

    conflict = PinConflict(Path("/sdks/a"), "2.34.0.250424", Path("/p/.qnn-version"), VERSION, installed=True)
    assert conflict.switch() == f'`eval "$(qnnctl env)"` switches this shell to SDK {VERSION}'
    assert conflict._replace(installed=False).switch() == (
        f'`qnnctl install {VERSION}`, then `eval "$(qnnctl env)"` switches this shell to SDK {VERSION}')


# -- an installed SDK found as `install` would reuse it ----------------------------------------


def test_an_installed_sdk_is_resolved_without_loading_the_install(cache_dir: Path) -> None:
    """`lower` with its SDK installed, as it usually is: the SDK `install` would reuse, found
    without importing the install's modules (requests among them), by version or by a pin."""
    root = install_tree_into_cache(cache_dir, VERSION)
    code = ("import os, sys\nfrom pathlib import Path\nfrom qnnctl.run.environment import resolve_sdk\n"
            "from qnnctl.sdk.cache import Cache\n"
            "spec = sys.argv[1] or None\n"
            "_, sdk = resolve_sdk(spec, dict(os.environ), Path.cwd(), Cache(Path(os.environ['QNNCTL_CACHE_DIR'])))\n"
            "print(sdk.root, 'qnnctl.install.pipeline' in sys.modules, 'requests' in sys.modules)\n")
    _pin(f"{VERSION}\n")
    for spec in (VERSION, ""):
        found = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, env=os.environ,
                               check=False)
        assert (found.returncode, found.stdout) == (0, f"{root} False False\n"), found.stderr


def test_an_installed_sdk_is_held_to_the_projects_lock(cache_dir: Path) -> None:
    import json

    from qnnctl.errors import IntegrityError
    from qnnctl.run.environment import resolve_sdk
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.lockfile import LockedSdk, write_lock

    root = install_tree_into_cache(cache_dir, VERSION)
    manifest = json.loads((root / ".qnnctl.json").read_text())
    (root / ".qnnctl.json").write_text(json.dumps({**manifest, "sha256": "b" * 64}))
    lock = Path.cwd() / "qnnctl.lock"
    write_lock(lock, LockedSdk(lock, VERSION, "a" * 64), "trusted")
    with pytest.raises(IntegrityError) as caught:
        resolve_sdk(VERSION, dict(os.environ), Path.cwd(), Cache(cache_dir))
    assert caught.value.message.startswith(f"SDK {VERSION} at {root} (qnnctl cache)")
    assert caught.value.message.endswith(f"{'b' * 64}; qnnctl.lock pins {'a' * 64}")


def test_without_a_mirror_an_sdk_missing_or_lacking_pinned_components_is_installed(
        cache_dir: Path, server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing vouches for the SDK (no lock, no mirror): one installed is used as it is, one
    missing, or lacking components its pin names, is installed from where Qualcomm publishes it
    (here the loopback server in its place)."""
    from qnnctl.run.environment import resolve_sdk
    from qnnctl.sdk import versions
    from qnnctl.sdk.cache import Cache
    from tests.sdkfactory import build_archive

    (tmp_path / "archives").mkdir()
    server.add(PATH, build_archive(tmp_path / "archives", "zip", SdkSpec()).read_bytes())
    monkeypatch.setattr(versions, "DEFAULT_BASE_URL", server.base)
    cache = Cache(cache_dir)
    _pin(f"{VERSION}\nhost\n")
    _, sdk = resolve_sdk(None, dict(os.environ), Path.cwd(), cache)
    assert sdk is not None
    assert (read_manifest(sdk.root) or {})["components"] == ["host"]
    fetched = len(server.requests)
    assert fetched > 0
    assert resolve_sdk(None, dict(os.environ), Path.cwd(), cache)[1] == sdk
    assert len(server.requests) == fetched  # used as it is
    _pin(f"{VERSION}\nhost,android\n")
    assert resolve_sdk(None, dict(os.environ), Path.cwd(), cache)[1] == sdk
    assert (read_manifest(sdk.root) or {})["components"] == ["host", "android"]
    assert len(server.requests) > fetched


# -- an SDK used without install, held to the project's lock -----------------------------------


def test_an_sdk_used_without_install_is_held_to_the_projects_lock(cache_dir: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    import json

    from qnnctl.errors import IntegrityError
    from qnnctl.run.environment import hold_sdk_to_lock
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.lockfile import LockedSdk, write_lock

    cache = Cache(cache_dir)
    root = install_tree_into_cache(cache_dir, VERSION)
    sdk = Sdk(root, VERSION, "qnnctl cache")
    hold_sdk_to_lock(sdk, cache, Path.cwd())  # no lock: nothing to hold it to
    lock = Path.cwd() / "qnnctl.lock"
    write_lock(lock, LockedSdk(lock, VERSION, "a" * 64), "trusted")
    # No record of the archive it came from: used unchecked, said so (not refused, as --locked would).
    with caplog.at_level("WARNING", logger="qnnctl"):
        hold_sdk_to_lock(sdk, cache, Path.cwd() / "src")
    assert [r.getMessage() for r in caplog.records] == [
        f"SDK {VERSION} at {root} (qnnctl cache) cannot be checked against {lock}: qnnctl has no record of the "
        "archive it came from, and the lock pins no digest of its components (a lock of schema 1, written before "
        "they existed); used unchecked"]
    manifest = json.loads((root / ".qnnctl.json").read_text())
    (root / ".qnnctl.json").write_text(json.dumps({**manifest, "sha256": "b" * 64}))
    with pytest.raises(IntegrityError) as caught:
        hold_sdk_to_lock(sdk, cache, Path.cwd())
    assert caught.value.message.endswith(f"{'b' * 64}; qnnctl.lock pins {'a' * 64}")
    assert caught.value.hint == (
        f"reinstall the locked archive: `qnnctl install --force {VERSION}`, or, if the SDK in use is the one to "
        f"trust, write the lock again: `qnnctl lock {VERSION}`")


def test_an_sdk_used_is_held_then_held_to_the_lock_and_let_go_when_the_lock_refuses(cache_dir: Path) -> None:
    """What a command that uses an SDK takes (hold_checked): a hold on it, this process's, then the
    project's lock's check; the SDK the lock refuses is held no longer, and the refusal is the
    lock's, with the hint for an SDK of the cache."""
    import json
    import os

    from qnnctl.errors import IntegrityError
    from qnnctl.run.environment import hold_checked
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.holds import held_by
    from qnnctl.sdk.lockfile import LockedSdk, write_lock

    cache = Cache(cache_dir)
    root = install_tree_into_cache(cache_dir, VERSION)
    sdk = Sdk(root, VERSION, "qnnctl cache")
    held = hold_checked(sdk, cache, Path.cwd())  # no lock: held, nothing to check it against
    assert held is not None
    try:
        assert [holder.pid for holder in held_by(cache, VERSION)] == [os.getpid()]
    finally:
        os.close(held)
    assert held_by(cache, VERSION) == []
    lock = Path.cwd() / "qnnctl.lock"
    write_lock(lock, LockedSdk(lock, VERSION, "a" * 64), "trusted")
    manifest = json.loads((root / ".qnnctl.json").read_text())
    (root / ".qnnctl.json").write_text(json.dumps({**manifest, "sha256": "b" * 64}))
    with pytest.raises(IntegrityError) as caught:
        hold_checked(sdk, cache, Path.cwd())
    assert caught.value.message.endswith(f"{'b' * 64}; qnnctl.lock pins {'a' * 64}")
    assert caught.value.hint == (
        f"reinstall the locked archive: `qnnctl install --force {VERSION}`, or, if the SDK in use is the one to "
        f"trust, write the lock again: `qnnctl lock {VERSION}`")
    assert held_by(cache, VERSION) == []

@pytest.mark.parametrize("origin", ["QNN_SDK_ROOT", "--sdk", "qnnctl env"])
def test_a_folder_named_by_path_that_the_lock_refuses_is_told_how_to_use_the_locked_sdk(
        cache_dir: Path, tmp_path: Path, origin: str) -> None:
    """An SDK folder outside the cache, named by a path, that the lock refuses: reinstalling into the
    cache alone would leave the path naming the same folder, so the hint says how to name the locked
    one instead. An SDK of the cache, however it was named, and one found elsewhere keep the hint to
    reinstall it."""
    from qnnctl.errors import IntegrityError
    from qnnctl.run.environment import hold_sdk_to_lock
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.lockfile import LockedSdk, write_lock

    cache = Cache(cache_dir)
    lock = Path.cwd() / "qnnctl.lock"
    write_lock(lock, LockedSdk(lock, VERSION, "0" * 64, component_sha256={"host": "1" * 64}), "trusted")
    outside = build_sdk_tree(tmp_path / "opt" / VERSION)
    cached = install_tree_into_cache(cache_dir, VERSION)
    reinstall = (f"reinstall the locked archive: `qnnctl install --force {VERSION}`, or, if the SDK in use is the "
                 f"one to trust, write the lock again: `qnnctl lock {VERSION}`")
    named = {
        "QNN_SDK_ROOT": f"QNN_SDK_ROOT names {outside}: install the locked SDK into qnnctl's cache with "
                        f"`qnnctl install {VERSION}`, then unset QNN_SDK_ROOT (or point it there: "
                        f"`export QNN_SDK_ROOT=\"$(qnnctl install {VERSION})\"`)",
        "--sdk": f"--sdk names {outside}: install the locked SDK into qnnctl's cache with "
                 f"`qnnctl install {VERSION}`, and name it by its version: `--sdk {VERSION}`",
        "qnnctl env": f"this shell was set up by `qnnctl env` for {outside}: install the locked SDK into qnnctl's "
                      f"cache with `qnnctl install {VERSION}`, then set the shell up for it: "
                      f"`eval \"$(qnnctl env {VERSION})\"`",
    }
    for sdk, hint in ((Sdk(outside, VERSION, origin), named[origin]), (Sdk(cached, VERSION, origin), reinstall),
                      (Sdk(outside, VERSION, "ExecuTorch cache"), reinstall)):
        with pytest.raises(IntegrityError) as refused:
            hold_sdk_to_lock(sdk, cache, Path.cwd())
        assert refused.value.hint == hint, sdk


def test_an_sdk_named_by_path_that_others_can_write_is_refused_naming_it_and_who_named_it(tmp_path: Path) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.sdk.select import named_sdk

    root = build_sdk_tree(tmp_path / "opt" / "qairt")
    assert named_sdk(root, "--sdk") == Sdk(root, VERSION, "--sdk")
    (root / "lib").chmod(0o777)
    with pytest.raises(IntegrityError) as refused:
        named_sdk(root, "--sdk")
    assert refused.value.message == (
        f"the SDK folder {root} (--sdk) is not used: {root / 'lib'} is writable by its group and others "
        "(mode 0777), so another user could put code there that runs as you")


# -- a version prefix looked up in what is installed, and in the mirror's index when asked --------


MIRRORED = "2.37.9.990101"  # a 2.37 only the mirror's index lists


def _mirror_of(server: FaultServer, tmp_path: Path, version: str = MIRRORED) -> str:
    """The server as a mirror holding the archive of `version`, indexed; its base."""
    import hashlib
    import json

    from tests.sdkfactory import build_archive

    (tmp_path / "archives").mkdir(exist_ok=True)
    data = build_archive(tmp_path / "archives", "zip", SdkSpec(version=version)).read_bytes()
    server.add(f"/{version}/v{version}.zip", data)
    index = {"schema": 1, "versions": {version: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}}}
    server.add("/index.json", json.dumps(index).encode(), "application/json")
    return server.base


def test_a_prefix_is_resolved_in_the_mirrors_index_when_the_sdk_may_be_installed(
        cache_dir: Path, server: FaultServer, tmp_path: Path) -> None:
    from qnnctl.errors import NotInstalledError
    from qnnctl.run.environment import resolve_for_dry_run, resolve_sdk
    from qnnctl.sdk.cache import Cache

    environ = {**os.environ, "QNNCTL_MIRROR": _mirror_of(server, tmp_path)}
    cache = Cache(cache_dir)
    selection, sdk, _ = resolve_for_dry_run("2.37", environ, Path.cwd(), cache)
    assert (selection.version, sdk) == (MIRRORED, Sdk(cache_dir / "sdks" / MIRRORED, MIRRORED, "not installed yet"))
    # A look-up that may not install keeps to what is installed and the known releases.
    with pytest.raises(NotInstalledError) as caught:
        resolve_for_dry_run("2.37", environ, Path.cwd(), cache, allow_install=False)
    assert caught.value.message == f"SDK {VERSION} is not installed"
    selection, sdk = resolve_sdk("2.37", environ, Path.cwd(), cache)
    assert (selection.version, sdk) == (MIRRORED, Sdk(cache_dir / "sdks" / MIRRORED, MIRRORED, "qnnctl cache"))


def test_a_prefix_counts_only_the_sdks_installed_whole(cache_dir: Path) -> None:
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import resolve_spec

    damaged = install_tree_into_cache(cache_dir, MIRRORED)
    (damaged / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").unlink()
    assert resolve_spec("2.37", Cache(cache_dir), dict(os.environ)) == VERSION
    install_tree_into_cache(cache_dir, "2.37.8.990101")
    assert resolve_spec("2.37", Cache(cache_dir), dict(os.environ)) == "2.37.8.990101"


def test_a_pins_prefix_is_resolved_where_the_version_given_would_be(cache_dir: Path, server: FaultServer,
                                                                     tmp_path: Path) -> None:
    """A pin that names a prefix (`2.37`) is read as a version given is: the newest installed match,
    then, for a look-up that may install, the mirror's index; `qnnctl env`'s look-up never asks it."""
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import select_sdk

    environ = {**os.environ, "QNNCTL_MIRROR": _mirror_of(server, tmp_path)}
    cache = Cache(cache_dir)
    _pin("2.37\n")
    assert select_sdk(None, environ, Path.cwd(), cache, mirror=True).version == MIRRORED
    assert select_sdk(None, environ, Path.cwd(), cache).version == VERSION  # the known release
    install_tree_into_cache(cache_dir, "2.37.8.990101")
    assert select_sdk(None, dict(os.environ), Path.cwd(), cache).version == "2.37.8.990101"


def test_an_installed_copy_is_refused_when_it_is_not_what_it_claims_or_others_can_write_it(
        cache_dir: Path, tmp_path: Path) -> None:
    """find_installed, which every look-up of a version asks: qnnctl's own copy, a linked folder and
    ExecuTorch's cache folder, each refused by name where another user could write it; a linked
    folder whose libraries changed since it was linked; ExecuTorch's folder whose libraries are
    another SDK's than its name says."""
    from qnnctl.errors import IntegrityError
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import find_installed
    from qnnctl.sdk.stores import link_sdk

    cache = Cache(cache_dir)
    environ = {**os.environ, "QNN_STAGING_DIR": str(tmp_path / "staging")}

    def refused(version: str) -> IntegrityError:
        with pytest.raises(IntegrityError) as caught:
            find_installed(version, cache, environ)
        return caught.value

    def writable(what: str, lib: Path) -> str:
        return (f"{what} is not used: {lib} is writable by its group and others (mode 0777), so another user "
                "could put code there that runs as you")

    own = install_tree_into_cache(cache_dir, OTHER_VERSION)
    (own / "lib").chmod(0o777)
    assert refused(OTHER_VERSION).message == writable(f"SDK {OTHER_VERSION} of qnnctl's cache ({own})", own / "lib")

    linked = build_sdk_tree(tmp_path / "vendor" / VERSION, SdkSpec(build_id="v2.37.0.250724101010"))
    link_sdk(linked, None, cache, environ)
    assert find_installed(VERSION, cache, environ) == Sdk(linked, VERSION, "link")
    (linked / "lib").chmod(0o777)
    assert refused(VERSION).message == writable(f"SDK {VERSION}, linked to {linked},", linked / "lib")
    (linked / "lib").chmod(0o755)
    build_sdk_tree(linked, SdkSpec(build_id="v2.37.0.250724999999"))
    assert refused(VERSION).message == (
        f"SDK {VERSION} is linked to {linked}, but its libraries are now build 2.37.0.250724999999 (SDK "
        f"{VERSION}), not build 2.37.0.250724101010 as when it was linked; it is not used")

    version = "2.36.1.250708"
    candidate = build_sdk_tree(tmp_path / "staging" / f"sdk-{version}",
                               SdkSpec(version=version, build_id="v2.36.1.250708101010"))
    assert find_installed(version, cache, environ) == Sdk(candidate, version, "ExecuTorch cache")
    build_sdk_tree(candidate, SdkSpec(version=version, build_id="v2.37.0.250724101010"))
    error = refused(version)
    assert (error.message, error.hint) == (
        f"ExecuTorch's cache folder {candidate} is named for SDK {version}, but its libraries are build "
        f"2.37.0.250724101010 (SDK {VERSION}); it is not used",
        f"remove that folder (ExecuTorch fetches the SDK again when it needs it), then `qnnctl install {version}`")
    (candidate / "lib").chmod(0o777)
    assert refused(version).message == writable(f"ExecuTorch's cache folder {candidate}", candidate / "lib")


# -- this shell's SDK and the project's pin ----------------------------------------------------


def _shell_for_root(root: Path) -> dict[str, str]:
    """The environment of a shell that `qnnctl env` set up for the SDK at `root`."""
    from qnnctl.shell.exports import MARKER, Marker

    return {**os.environ, "QNN_SDK_ROOT": str(root), MARKER: Marker(str(root), True).dumps()}


def test_a_shell_set_up_for_one_sdk_and_a_pin_naming_another_disagree(cache_dir: Path, tmp_path: Path) -> None:
    """The pin's prefix resolved as the commands would (the SDKs installed first), the shell's
    SDK told by what it holds, else by its folder's name when it has gone."""
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import PinConflict, pin_conflict

    cache = Cache(cache_dir)
    shell = build_sdk_tree(tmp_path / "vendor" / "qairt", SdkSpec(version=VERSION))  # no version in its name
    environ = _shell_for_root(shell)
    pin = _pin("2.37\n")
    assert pin_conflict(environ, Path.cwd(), cache) is None  # 2.37 is 2.37.0.250724, the shell's
    install_tree_into_cache(cache_dir, "2.37.8.990101")
    assert pin_conflict(environ, Path.cwd(), cache) == PinConflict(shell, VERSION, pin, "2.37.8.990101", True)
    assert pin_conflict(environ, Path.cwd()) is None  # without a cache: the known releases
    gone = tmp_path / "gone" / OTHER_VERSION
    assert pin_conflict(_shell_for_root(gone), Path.cwd(), cache) == PinConflict(
        gone, OTHER_VERSION, pin, "2.37.8.990101", True)
    _pin("2.37.0.250724\n")
    assert pin_conflict(_shell_for_root(gone), Path.cwd(), cache) == PinConflict(
        gone, OTHER_VERSION, pin, VERSION, False)


def test_the_pin_a_shell_is_compared_with_never_asks_the_mirror(cache_dir: Path, server: FaultServer,
                                                                 tmp_path: Path) -> None:
    """`qnnctl env` runs at every shell's start: it reads no mirror's index."""
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.select import pin_conflict

    shell = build_sdk_tree(tmp_path / "vendor" / "qairt", SdkSpec(version=VERSION))
    environ = {**_shell_for_root(shell), "QNNCTL_MIRROR": _mirror_of(server, tmp_path)}
    _pin("2.37\n")
    assert pin_conflict(environ, Path.cwd(), Cache(cache_dir)) is None
    assert server.requests == []


def test_an_sdk_named_by_path_in_a_locked_project_is_held_to_the_lock(cache_dir: Path, tmp_path: Path) -> None:
    from qnnctl.errors import IntegrityError
    from qnnctl.run.environment import resolve_sdk
    from qnnctl.sdk.cache import Cache
    from qnnctl.sdk.lockfile import LockedSdk, write_lock

    root = build_sdk_tree(tmp_path / "vendor" / VERSION, SdkSpec(version=VERSION))
    assert resolve_sdk(str(root), dict(os.environ), Path.cwd(), Cache(cache_dir))[1] == Sdk(root, VERSION, "--sdk")
    lock = Path.cwd() / "qnnctl.lock"
    write_lock(lock, LockedSdk(lock, VERSION, "a" * 64, component_sha256={"host": "c" * 64}), "trusted")
    with pytest.raises(IntegrityError) as caught:
        resolve_sdk(str(root), dict(os.environ), Path.cwd(), Cache(cache_dir))
    assert str(root) in caught.value.message


def test_a_pin_is_read_no_further_than_a_pin_can_be(tmp_path: Path) -> None:
    """A project's `.qnn-version` may be a link to any file: at most PIN_MOST bytes are read of it,
    one byte more is refused naming it, and a file of gigabytes costs no more memory than that."""
    import tracemalloc

    from qnnctl.sdk.select import PIN_MOST, pin_text

    pin = tmp_path / ".qnn-version"
    text = f"{VERSION}\n" + "#" * (PIN_MOST - len(VERSION) - 2) + "\n"
    pin.write_text(text)
    assert pin_text(pin) == text  # exactly the most
    pin.write_text(text + "#")
    with pytest.raises(UsageError) as refused:
        pin_text(pin)
    assert (refused.value.message, refused.value.hint) == (
        f"{pin} is larger than a pin can be ({PIN_MOST} bytes)", "fix it, or rewrite it with `qnnctl use VERSION`")
    with open(pin, "r+b") as handle:
        handle.truncate(1 << 30)  # a gigabyte, sparse
    tracemalloc.start()
    try:
        with pytest.raises(UsageError):
            pin_text(pin)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * PIN_MOST, peak

