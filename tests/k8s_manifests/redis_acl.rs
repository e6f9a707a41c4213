//! The Redis ACL examples grant exactly the commands posgate sends: its client's own
//! and the ones its Lua scripts call, on the cluster's own keys.

use super::*;

/// Commands posgate's Redis client sends itself and needs: scripts by SHA with a load on
/// NOSCRIPT, the connect probe and pub/sub keep-alive, the event subscription. (AUTH needs
/// no ACL permission; CLIENT SETINFO at connect may be refused, its answer is ignored.)
const CLIENT_COMMANDS: &[&str] = &["evalsha", "script|load", "ping", "subscribe"];

/// Commands an ACL example may grant beyond [`CLIENT_COMMANDS`] and the scripts' ones:
/// the ones of options (`WAIT` with `--redis-wait-replicas`, `ROLE` on the master a
/// `redis+sentinel://` URL's sentinels name, `SELECT` for a `/db`).
const OPTIONAL_COMMANDS: &[&str] = &["client|setinfo", "select", "wait", "role"];

/// The commands the Lua scripts call (`redis.call('GET', ...)`), lowercase.
fn lua_commands() -> BTreeSet<String> {
    let mut cmds = BTreeSet::new();
    let scripts = files_under(&root().join("src/store/lua"), &["lua"]);
    assert!(!scripts.is_empty(), "no Lua scripts found");
    for file in scripts {
        let text = read(&file);
        for call in ["redis.call(", "redis.pcall("] {
            let mut rest = text.as_str();
            while let Some(i) = rest.find(call) {
                let after = rest[i + call.len()..].trim_start();
                rest = after;
                let Some(quote) = after.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                    continue; // a computed command name; none today
                };
                let name: String = after[1..].chars().take_while(|c| *c != quote).collect();
                cmds.insert(name.to_ascii_lowercase());
            }
        }
    }
    cmds
}

/// `POSGATE_CLUSTER`'s value in the YAML files of `dir` (not recursive): the
/// `posgate-store` ConfigMap's `POSGATE_CLUSTER: value` line.
fn cluster_in(dir: &Path) -> Option<String> {
    files_under(dir, &["yaml", "yml"])
        .into_iter()
        .filter(|file| file.parent() == Some(dir))
        .find_map(|file| {
            read(&file).lines().find_map(|l| {
                let value = l.trim().strip_prefix("POSGATE_CLUSTER:")?;
                Some(value.trim().trim_matches('"').to_string())
            })
        })
}

#[test]
fn redis_acl_examples_grant_exactly_the_commands_posgate_sends() {
    let mut expected: BTreeSet<String> = lua_commands();
    expected.extend(CLIENT_COMMANDS.iter().map(|c| c.to_string()));
    let acl_files = files_under(&root().join("k8s"), &["acl"]);
    assert!(!acl_files.is_empty(), "no Redis ACL example under k8s/");
    for file in acl_files {
        let text = read(&file);
        let user_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("user "))
            .collect();
        assert_eq!(
            user_lines.len(),
            1,
            "{}: one `user` line expected",
            rel(&file)
        );
        let rules: Vec<&str> = user_lines[0].split_whitespace().collect();
        let granted: BTreeSet<String> = rules
            .iter()
            .filter_map(|r| r.strip_prefix('+'))
            .map(str::to_string)
            .collect();
        let missing: Vec<_> = expected.difference(&granted).collect();
        let extra: Vec<_> = granted
            .difference(&expected)
            .filter(|c| !OPTIONAL_COMMANDS.contains(&c.as_str()))
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{}: ACL commands differ from what posgate sends; missing {missing:?}, not used {extra:?}",
            rel(&file)
        );
        assert!(rules.contains(&"-@all"), "{}: start from -@all", rel(&file));
        // Keys and channel of this overlay's cluster only.
        let dir = file.parent().expect("parent");
        let cluster = cluster_in(dir).unwrap_or_else(|| "posgate".to_string());
        let keys = format!("~posgate:{{{cluster}}}:*");
        let channel = format!("&posgate:{{{cluster}}}:events");
        let patterns: Vec<&&str> = rules
            .iter()
            .filter(|r| r.starts_with('~') || r.starts_with('&') || r.starts_with('%'))
            .collect();
        assert_eq!(
            patterns,
            vec![&keys.as_str(), &channel.as_str()],
            "{}: key and channel patterns must be exactly {keys} and {channel} (POSGATE_CLUSTER={cluster})",
            rel(&file)
        );
        println!(
            "{}: {} commands, keys {keys}, channel {channel}",
            rel(&file),
            granted.len()
        );
    }
}
