"""`fusebox costqos run`'s arguments: bad input is a clear error and exit 2, before anything starts."""

from __future__ import annotations

import pytest

from fusebox.cli import main


@pytest.mark.parametrize("flag,value,words", [
    ("--listen", "8080", "'8080' is not HOST:PORT -- e.g. 0.0.0.0:8080"),
    ("--listen", "0.0.0.0:70000", "is not HOST:PORT"),
    ("--interval", "0", "'0' is not a positive number of seconds -- e.g. 30"),
    ("--step", "soon", "'soon' is not a positive number of seconds"),
    ("--max-queries", "0", "'0' is not a whole number >= 1 -- e.g. 8"),
])
def test_a_bad_argument_exits_2_naming_it_and_the_fix(capsys, flag, value, words):
    args = {"--prometheus": "http://127.0.0.1:9", "--listen": "127.0.0.1:9", flag: value}
    argv = ["costqos", "run", *(w for kv in args.items() for w in kv)]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_namespace_and_all_namespaces_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        main(["costqos", "run", "--prometheus", "http://x", "--listen", ":8080", "--namespace", "a", "--all-namespaces"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_a_missing_kubeconfig_exits_2_before_anything_starts(capsys, tmp_path):
    rc = main(["costqos", "run", "--prometheus", "http://x", "--listen", ":8080", "--kubeconfig", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--kubeconfig {tmp_path / 'nope'}: no such file -- name an existing kubeconfig" in err
