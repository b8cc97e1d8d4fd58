"""The `unit` marker: which tests it takes (read from the test files) and the guard that holds them to it."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import textwrap

import pytest
from _unit_rule import _Module, guard, reaching

SUPPORT = """
import http.server

def serve():
    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), None)

def pure():
    return 1

class Server:
    def start(self):
        serve()
"""

TESTS = """
import subprocess as sp
from _h import Server, pure

def test_pure():
    assert pure() == 1

def test_server():
    Server().start()

def test_imports_inside():
    import os
    os.fork()

def test_alias():
    sp.run(["true"])

def local_function():
    return Server

def test_through_a_local_function():
    local_function()

def fixture_that_reads(tmp_path):
    return tmp_path.read_text()
"""


def test_the_rule_follows_functions_classes_aliases_and_function_level_imports():
    mods = {"_h": _Module("_h", ast.parse(SUPPORT)), "t": _Module("t", ast.parse(TESTS))}
    assert reaching(mods) == {
        ("_h", "serve"),
        ("_h", "Server"),
        ("_h", "Server.start"),
        ("t", "test_server"),
        ("t", "test_imports_inside"),
        ("t", "test_alias"),
        ("t", "local_function"),
        ("t", "test_through_a_local_function"),
    }


def test_the_guard_refuses_and_records_each_start_then_puts_everything_back():
    before = (subprocess.Popen._execute_child, os.fork, os.system, socket.socket.bind, socket.socket.connect)
    seen: list[str] = []
    with guard(seen):
        with pytest.raises(RuntimeError, match="mark the test @pytest.mark.process"):
            subprocess.run(["true"])
        with pytest.raises(RuntimeError):
            os.fork()
        with pytest.raises(RuntimeError):
            os.system("true")
        with socket.socket() as s, pytest.raises(RuntimeError):
            s.bind(("127.0.0.1", 0))
        with socket.socket() as s, pytest.raises(RuntimeError):
            s.connect(("127.0.0.1", 9))
    assert seen == [
        "subprocess.Popen(['true'])",
        "os.fork()",
        "os.system('true')",
        "socket.bind(('127.0.0.1', 0))",
        "socket.connect(('127.0.0.1', 9))",
    ]
    after = (subprocess.Popen._execute_child, os.fork, os.system, socket.socket.bind, socket.socket.connect)
    assert after == before
    seen.clear()
    with guard(seen, refuse=False):  # outside `-m unit`: recorded, and let through
        assert subprocess.run(["true"]).returncode == 0
    assert seen == ["subprocess.Popen(['true'])"]


HOOKS = "from _unit_rule import pytest_collection_modifyitems, pytest_configure, pytest_runtest_call, pytest_runtest_setup\n"


OUT_OF_SIGHT = textwrap.dedent(
    """
    import subprocess

    import pytest

    from fusebox.tooling import free_port  # binds a port: product code the rule does not read

    def test_pure():
        assert 1 + 1 == 2

    def test_binds_out_of_sight():
        free_port()

    @pytest.mark.process
    def test_marked():
        free_port()

    def test_runs_a_program():
        subprocess.run(["true"], check=True)
    """
)
SAID = ("*test_inner.py::test_binds_out_of_sight is `unit` by tests/_unit_rule.py but called "
        "socket.bind(('127.0.0.1', *)): mark it @pytest.mark.process*")  # free_port picks the port


def test_a_unit_test_that_starts_a_process_out_of_sight_fails_under_m_unit_and_says_how_to_mark_it(pytester):
    pytester.makeconftest(HOOKS)
    pytester.makepyfile(test_inner=OUT_OF_SIGHT)
    result = pytester.runpytest("-m", "unit", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, deselected=2)
    result.stdout.fnmatch_lines([SAID])


@pytest.mark.process  # the inner run binds ports and runs `true`
def test_the_whole_suite_runs_such_a_test_and_says_the_same_as_a_warning(pytester):
    pytester.makeconftest(HOOKS)
    pytester.makepyfile(test_inner=OUT_OF_SIGHT)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, warnings=1)
    result.stdout.fnmatch_lines([SAID])


@pytest.mark.process  # the inner run's first test binds ports, in a thread that outlives it
def test_a_server_thread_another_test_left_running_does_not_fail_a_unit_test(pytester):
    pytester.makeconftest(HOOKS)
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            """
            import socket
            import threading
            import time

            import pytest

            binds = []
            threads = []
            stop = threading.Event()

            def bind_until_stopped():
                while not stop.is_set():
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", 0))
                    binds.append(1)
                    time.sleep(0.001)

            @pytest.mark.process
            def test_leaves_a_binding_thread_behind():
                threads.append(threading.Thread(target=bind_until_stopped, daemon=True))
                threads[0].start()

            def test_unit_while_it_binds():
                seen = len(binds)
                while len(binds) < seen + 5 and threads[0].is_alive():  # it binds during this test
                    time.sleep(0.001)
                stop.set()
                assert len(binds) >= seen + 5, "the thread stopped binding"
            """
        )
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
