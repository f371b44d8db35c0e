# NoETL python task runner (passed to the interpreter with `-c`, after
# compile.py: how a task's code is compiled).
#
# Protocol: one JSON request per line on stdin, one response line per request
# on the ORIGINAL stdout, prefixed by MARK. At start the original stdout is
# duplicated for the protocol and fd 1 is pointed at stderr, so nothing the
# task prints (Python-level or C-level, subprocesses included) can corrupt
# the protocol. Python-level prints are captured per request (bounded) and
# returned in the response. The loop serves many requests, so the same
# script can back a warm pool of interpreters.
import datetime
import io
import json
import linecache
import os
import sys
import traceback
import uuid
from time import perf_counter as _clock

LIMIT = 4096
MARK = "\x1eNOETL-RESULT "
# Written to fd 2 before each response: once the executor has read it, it
# has read everything the task wrote to fd 1 and 2 (the pipe keeps order).
END = b"\x1eNOETL-END\n"
RESERVED = frozenset(("args", "_prev", "iter", "ctx", "workload", "result", "main"))
# Compiled task code by source: a loop's iterations run the same code, and
# compiling it again is most of a small task's time. Bounded; emptied when full.
_COMPILED = {}
_COMPILED_MAX = 256
# Modules every task's globals start with, as NoETL's python tool binds
# them: its playbooks call `json.dumps` without importing json. An input of
# the same name takes the name, as there.
_MODULES = {"json": json, "os": os, "datetime": datetime, "uuid": uuid}

_proto = os.dup(1)
os.dup2(2, 1)

# The process state a task may change that is put back after each task
# (`_restore`): the environment as the interpreter started with it (a
# task's `os.environ["X"] = secret` must not reach a later task, of this
# execution or another) and the working directory.
_ENVIRON = os.environ
_ENV = dict(os.environ)
_ENV_DATA = dict(getattr(os.environ, "_data", {}))
_CWD = os.getcwd()
_stdin = sys.stdin.buffer
sys.stdin = io.StringIO("")


# Built once: `json.dumps` / `json.loads` build or look these up on every
# call, which is a good part of a small task's time.
_decode = json.JSONDecoder().raw_decode
_encode = json.JSONEncoder().encode
_encode_result = json.JSONEncoder(allow_nan=False).encode


class _Capture(io.TextIOBase):
    """A bounded text sink: keeps the first LIMIT characters, counts the rest."""

    def __init__(self):
        self._parts = []
        self._kept = 0
        self._total = 0

    def writable(self):
        return True

    def write(self, s):
        s = str(s)
        self._total += len(s)
        room = LIMIT - self._kept
        if room > 0:
            part = s[:room]
            self._parts.append(part)
            self._kept += len(part)
        return len(s)

    def text(self):
        t = "".join(self._parts)
        if self._total > self._kept:
            t += "\n...[truncated %d chars]" % (self._total - self._kept)
        return t


class _MissingLibs(Exception):
    def __init__(self, missing):
        super().__init__(", ".join(missing))
        self.missing = missing


def _call_main(fn, args):
    """main() with no parameter; main(a, b) with the values of args' keys
    `a` and `b` when it names them (NoETL's convention); else main(args)."""
    import inspect  # here, not at start: an interpreter starts in half the time

    try:
        sig = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        sig = []
    params = [
        p for p in sig if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    named = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    required = [p for p in params if p.default is p.empty]
    by_name = (
        isinstance(args, dict)
        and named
        and len(named) == len(params)
        and all(p.name in args for p in required)
        and any(p.name in args for p in named)
    )
    if by_name:
        out = fn(**{p.name: args[p.name] for p in named if p.name in args})
    elif params:
        out = fn(args)
    else:
        out = fn()
    if inspect.iscoroutine(out):
        import asyncio

        out = asyncio.run(out)
    return out


def _traceback(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != "<string>"]
    text = "Traceback (most recent call last):\n" if frames else ""
    text += "".join(traceback.format_list(frames))
    text += "".join(traceback.format_exception_only(type(exc), exc))
    if len(text) > LIMIT:
        text = "...[truncated]\n" + text[-LIMIT:]
    return text


def _import_libs(libs, g):
    """Bind each `libs` entry in the globals `g`; the names of the modules
    the interpreter lacks, all of them, when any is missing."""
    if not libs:
        return []
    import importlib
    import importlib.util

    missing = []
    for lib in libs:
        module = lib["module"]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    if missing:
        return missing
    for lib in libs:
        alias, module, name = lib["alias"], lib["module"], lib.get("name")
        if name is not None:
            mod = importlib.import_module(module)
            try:
                g[alias] = getattr(mod, name)
            except AttributeError:
                g[alias] = importlib.import_module(module + "." + name)
        elif alias == module and "." in module:
            importlib.import_module(module)  # `import a.b` binds `a`
            top = module.split(".")[0]
            g[top] = sys.modules[top]
        else:
            g[alias] = importlib.import_module(module)
    return []


def _compiled(code):
    """`_compile(code)`, once per distinct source (a SyntaxError is raised
    each time, never kept)."""
    hit = _COMPILED.get(code)
    if hit is None:
        hit = _compile(code)
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[code] = hit
    return hit


# The source last given to linecache, and its entry there.
_lines = (None, None)


def _show_lines(code):
    """Give tracebacks the task's source lines (kept while the same code
    runs again, unless the task dropped linecache's entry)."""
    global _lines
    if linecache.cache.get(TASK_FILE) is _lines[1] and _lines[0] == code:
        return
    entry = (len(code), None, code.splitlines(True), TASK_FILE)
    linecache.cache[TASK_FILE] = entry
    _lines = (code, entry)


_OK = {"ok": True}
_OK_HEAD = '{"ok": true, "stdout": "", "stderr": "", "result": '


def _handle(req):
    out, err = _Capture(), _Capture()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    resp = _OK
    encoded = "null"
    try:
        code = req.get("code")
        if not isinstance(code, str):
            raise TypeError("`code` must be a string")
        args = req.get("args")
        if args is None:
            args = {}
        g = {"__name__": "__noetl_task__", "__builtins__": __builtins__}
        g.update(_MODULES)
        if isinstance(args, dict):
            for k, v in args.items():
                if isinstance(k, str) and k.isidentifier() and not k.startswith("__") and k not in RESERVED:
                    g[k] = v
        g["args"] = args
        # NoETL's name of the inputs, unless an input is called so.
        g.setdefault("input_data", args)
        g["_prev"] = req.get("_prev")
        g["iter"] = req.get("iter")
        g["ctx"] = req.get("ctx")
        g["workload"] = req.get("workload")
        missing = _import_libs(req.get("libs") or [], g)
        if missing:
            raise _MissingLibs(missing)
        _show_lines(code)
        compiled, body = _compiled(code)
        exec(compiled, g)
        if body is not None:
            value = g[body]()
        elif "result" in g:
            value = g["result"]
        elif callable(g.get("main")):
            value = _call_main(g["main"], args)
        else:
            value = None
        try:
            encoded = _encode_result(value)
        except (TypeError, ValueError, OverflowError, RecursionError) as e:
            resp = {
                "ok": False,
                "kind": "python.result",
                "type": type(e).__name__,
                "message": "result is not JSON-serialisable: %s: %s" % (type(e).__name__, e),
            }
    except _MissingLibs as e:
        resp = {
            "ok": False,
            "kind": "python.libs",
            "type": "ModuleNotFoundError",
            "message": "`libs` names modules this interpreter does not have: %s"
            % ", ".join(e.missing),
        }
    except BaseException as e:  # noqa: B902 - SystemExit and KeyboardInterrupt included
        msg = str(e)
        resp = {
            "ok": False,
            "kind": "python.exception",
            "type": type(e).__name__,
            "message": "%s: %s" % (type(e).__name__, msg) if msg else type(e).__name__,
            "traceback": _traceback(e),
        }
    finally:
        sys.stdout, sys.stderr = saved
        _restore()
    stdout, stderr = out.text(), err.text()
    if resp is _OK and not stdout and not stderr:
        return _OK_HEAD + encoded + "}"
    resp = dict(resp, stdout=stdout, stderr=stderr)
    head = _encode(resp)
    return head[:-1] + ', "result": ' + encoded + "}"


def _restore():
    """Put back the environment and the working directory as they were when
    the interpreter started (cheap when the task changed neither)."""
    if os.environ is not _ENVIRON:  # the task rebound `os.environ`
        os.environ = _ENVIRON
    data = getattr(_ENVIRON, "_data", None)
    if data is None or data != _ENV_DATA:
        _ENVIRON.clear()  # unsetenv each name: subprocesses see it too
        _ENVIRON.update(_ENV)
    try:
        if os.getcwd() != _CWD:
            os.chdir(_CWD)
    except OSError:  # the task removed its working directory
        try:
            os.chdir(_CWD)
        except OSError:  # gone too: nothing of a secret is left there
            pass


def _answer(line):
    """Write one response line to the protocol fd, all of it."""
    data = memoryview((MARK + line + "\n").encode("utf-8"))
    while data:
        data = data[os.write(_proto, data):]


def _serve():
    for raw in _stdin:
        raw = raw.strip()
        if not raw:
            continue
        try:
            text = raw.decode("utf-8")
            req, end = _decode(text)
            if end != len(text):
                raise ValueError("extra data after the request")
            if not isinstance(req, dict):
                raise ValueError("request must be a JSON object")
            began = _clock()
            line = _handle(req)
            # How long the task took here (an interpreter's start-up and the
            # pipes left out): what the executor judges a source fast by.
            line = line[:-1] + ', "took_us": %d}' % ((_clock() - began) * 1e6)
        except Exception as e:  # a broken request, never the task's fault
            line = _encode(
                {"ok": False, "kind": "python.protocol", "message": "bad request: %s" % e}
            )
        try:
            os.write(2, END)
        except OSError:  # the task closed fd 2: the executor stops waiting
            pass
        _answer(line)


_serve()
