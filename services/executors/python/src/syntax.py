# `noetl validate`'s syntax check (passed with `-c`, after compile.py): a
# JSON list of sources on stdin; on stdout one JSON object, the
# interpreter's version and, for each source, null when it compiles as a
# task's code compiles, else where and why it does not. Nothing is run.
import json as _json
import sys as _sys


def _check(code):
    try:
        _compile(code)
        return None
    except SyntaxError as e:
        return {"line": e.lineno or 1, "column": e.offset or 1, "message": e.msg}
    except ValueError as e:  # a null byte in the source
        return {"line": 1, "column": 1, "message": str(e)}


_sys.stdout.write(
    _json.dumps(
        {
            "version": _sys.version.split()[0],
            "results": [_check(c) for c in _json.load(_sys.stdin)],
        }
    )
)
