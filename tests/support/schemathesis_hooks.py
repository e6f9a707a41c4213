"""Schemathesis hooks for tests/schema_fuzz.rs: the one check the built-in ones lack.

The API documents 503 (terminal unavailable, overloaded, not ready) and 504 (the
terminal did not answer in time) as answers a caller handles; any other 5xx is a
defect, even one the OpenAPI document lists (500 internal_error is listed because a
handler could panic, not because it may).
"""

import schemathesis


@schemathesis.hook
def map_query(ctx, query):
    """The feed waits up to wait_ms for an outcome when there is none: cap what the
    fuzzer asks for, so a hundred examples do not take a hundred long polls."""
    if query and isinstance(query.get("wait_ms"), int):
        query["wait_ms"] = min(query["wait_ms"], 50)
    return query


@schemathesis.check
def only_documented_server_errors(ctx, response, case):
    status = response.status_code
    if status >= 500 and status not in (503, 504):
        raise AssertionError(
            f"{case.method} {case.formatted_path} answered {status}: a server error "
            "other than the documented 503 and 504"
        )
