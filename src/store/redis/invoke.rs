//! One script call on the wire: `EVALSHA`, with the script loaded and the call repeated
//! on `NOSCRIPT` (a restarted or flushed Redis, or a replica promoted since the script
//! was loaded); for a write that must survive a failover (`RedisOptions::wait`), `WAIT`
//! pipelined behind it, so the replicas' acknowledgement costs no extra round trip.
//!
//! What it does not do: bound the call (the caller does) or judge the acknowledgements.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Cmd, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

/// `WAIT <replicas> <timeout>` after a write: how many replicas must have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub replicas: u32,
    /// How long Redis waits for them; well inside the call's own deadline.
    pub timeout: Duration,
}

/// Runs `script` with `keys` and `args`; with `wait`, returns how many replicas
/// acknowledged the write too.
pub(super) async fn invoke<A: ToRedisArgs>(
    conn: &mut ConnectionManager,
    script: &Script,
    keys: &[String],
    args: &[A],
    wait: Option<Wait>,
) -> RedisResult<(Value, Option<u64>)> {
    let Some(wait) = wait else {
        let mut inv = script.prepare_invoke();
        for key in keys {
            inv.key(key);
        }
        for arg in args {
            inv.arg(arg);
        }
        return Ok((inv.invoke_async::<Value>(conn).await?, None));
    };
    let evalsha = || -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    };
    let mut pipe = redis::pipe();
    pipe.add_command(evalsha())
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(wait.timeout.as_millis() as u64);
    let answer = match pipe.query_async::<(Value, u64)>(conn).await {
        Err(e) if e.kind() == ServerErrorKind::NoScript.into() => {
            script.prepare_invoke().load_async(conn).await?;
            pipe.query_async::<(Value, u64)>(conn).await?
        }
        other => other?,
    };
    Ok((answer.0, Some(answer.1)))
}
