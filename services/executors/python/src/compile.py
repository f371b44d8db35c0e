# How a python task's code is compiled: shared by the task runner
# (runner.py, which follows this text) and `noetl validate`'s syntax check
# (syntax.py), so the two accept the same code.

TASK_FILE = "<task>"


def _as_function(code):
    """NoETL's python tasks may `return` their result from the top level:
    such code runs as the body of a function whose return value is the
    result (falling through, its local `result`). Built from the syntax
    tree, so line numbers and string literals stay as written."""
    import ast

    tree = ast.parse(code, TASK_FILE, "exec")
    fn = ast.parse("def __noetl_body__():\n    pass\n").body[0]
    tail = ast.parse("return locals().get('result')").body
    fn.body = (tree.body or [ast.Pass()]) + tail
    module = ast.parse("")
    module.body = [fn]
    ast.fix_missing_locations(module)
    return compile(module, TASK_FILE, "exec")


def _compile(code):
    """The code object of `code`, and the name of the function to call for
    its result when its top level `return`s (else None)."""
    try:
        return compile(code, TASK_FILE, "exec"), None
    except SyntaxError as e:
        if "'return' outside function" not in str(e):
            raise
        return _as_function(code), "__noetl_body__"


