//! `posgate terminals import|export|remove|count` run as a binary against a real
//! `redis-server`: a good file is imported, a file with bad lines imports nothing and
//! names each bad line, `--replace` removes what the file lacks, an export imports back
//! unchanged (a tampered entry is exported as stored and named), and a Redis that is
//! down or a cluster with other settings is a clear error.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::binary::posgate;
use crate::support::redis_server::free_port;
use crate::support::RedisServer;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `posgate terminals <args> --redis-url <url>`.
fn terminals(url: &str, args: &[&str]) -> Output {
    let mut all = vec!["terminals"];
    all.extend(args);
    all.extend(["--redis-url", url]);
    posgate(&all, &[])
}

/// [`terminals`], asserting success; returns stdout.
pub(crate) fn ok(url: &str, args: &[&str]) -> String {
    let out = terminals(url, args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

pub(crate) fn count(url: &str) -> u64 {
    ok(url, &["count"])
        .trim()
        .parse()
        .expect("count prints a number")
}

pub(crate) fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

pub(crate) fn good_csv(n: usize) -> String {
    let mut s = String::from("id,addr,server_name\n");
    for i in 0..n {
        if i % 2 == 0 {
            s.push_str(&format!("pos-{i:04},10.0.{}.{}:443,\n", i / 256, i % 256));
        } else {
            s.push_str(&format!(
                "pos-{i:04},pos-{i}.shop.example:8443,pos-{i}.example\n"
            ));
        }
    }
    s
}

#[test]
fn import_count_replace_remove() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "good.csv", &good_csv(2_500));
    let out = ok(&url, &["import", file.to_str().unwrap()]);
    assert!(
        out.starts_with("imported 2500 terminals (2500 added, 0 updated, 0 removed) into "),
        "{out}"
    );
    assert_eq!(count(&url), 2_500);

    // Importing again changes nothing.
    let out = ok(&url, &["import", file.to_str().unwrap()]);
    assert!(out.contains("(0 added, 0 updated, 0 removed)"), "{out}");

    // --replace with the first 100 (one with a new address) removes the rest.
    let mut small = good_csv(100);
    small = small.replace("pos-0000,10.0.0.0:443,", "pos-0000,10.9.9.9:443,");
    let file = write(dir.path(), "small.csv", &small);
    let out = ok(&url, &["import", "--replace", file.to_str().unwrap()]);
    assert!(
        out.starts_with("imported 100 terminals (0 added, 1 updated, 2400 removed) into "),
        "{out}"
    );
    assert_eq!(count(&url), 100);

    let out = ok(&url, &["remove", "pos-0001", "pos-0002", "missing-1"]);
    assert!(
        out.starts_with("removed 2 terminals (1 not found)"),
        "{out}"
    );
    assert_eq!(count(&url), 98);
}

#[test]
fn bad_lines_are_all_named_and_nothing_is_imported() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let seed = write(dir.path(), "seed.csv", &good_csv(10));
    ok(&url, &["import", seed.to_str().unwrap()]);

    let bad = "id,addr,server_name\n\
               bad id,10.0.0.1:443,\n\
               new-1,10.0.0.2:443,\n\
               new-2,10.0.0.3:443,\n\
               new-3,10.0.0.4:99999,\n\
               new-4,10.0.0.5:443,\n";
    let file = write(dir.path(), "bad.csv", bad);
    let name = file.to_str().unwrap();
    let out = terminals(&url, &["import", name]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines[0].starts_with(&format!("{name}:2: ")), "{stderr}");
    assert!(lines[0].contains("bad id"), "{stderr}");
    assert!(lines[1].starts_with(&format!("{name}:5: ")), "{stderr}");
    assert!(lines[1].contains("port"), "{stderr}");
    assert!(lines[2].contains("nothing was imported"), "{stderr}");
    assert!(text(&out.stdout).is_empty());
    assert_eq!(count(&url), 10);

    // Duplicates and a wrong header are bad lines too.
    let file = write(
        dir.path(),
        "dup.csv",
        "id,addr,server_name\na,h:1,\nb,h:2,\na,h:3,\n",
    );
    let out = terminals(&url, &["import", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(":4: duplicate id \"a\" (first on line 2)"));
    let file = write(dir.path(), "header.csv", "id;addr;server_name\na;h:1;\n");
    let out = terminals(&url, &["import", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(":1: expected the header"));
    assert_eq!(count(&url), 10);
}

#[test]
fn flags_come_from_the_environment_too() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "t.csv", &good_csv(5));
    let env = [
        ("POSGATE_REDIS_URL", url.as_str()),
        ("POSGATE_CLUSTER", "c2"),
    ];
    let out = posgate(&["terminals", "import", file.to_str().unwrap()], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = posgate(&["terminals", "count"], &env);
    assert_eq!(text(&out.stdout).trim(), "5");
    // Another cluster name is another directory.
    assert_eq!(count(&url), 0);
}

#[test]
fn redis_down_and_other_settings_are_clear_errors() {
    let down = format!("redis://127.0.0.1:{}/", free_port());
    let out = terminals(&down, &["count"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("cannot connect to Redis"), "{stderr}");

    // The file is checked before Redis is contacted.
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "bad.csv", "id,addr,server_name\nx,nohost,\n");
    let out = terminals(&down, &["import", file.to_str().unwrap()]);
    assert!(
        text(&out.stderr).contains("bad.csv:2: "),
        "{}",
        text(&out.stderr)
    );

    // A cluster pinned with 64 shards refuses a command run with 8.
    let redis = RedisServer::start();
    let url = redis.url();
    assert_eq!(count(&url), 0);
    let out = terminals(&url, &["count", "--shards", "8"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cluster metadata mismatch"), "{stderr}");

    // Bad flags are usage errors.
    let out = terminals(&url, &["remove", "bad id"]);
    assert_eq!(out.status.code(), Some(2));
    let out = terminals(&url, &["remove"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_export_imports_back_unchanged() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "good.csv", &good_csv(1_500));
    ok(&url, &["import", file.to_str().unwrap()]);

    let out = terminals(&url, &["export"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "exported 1500 terminals from 64 shards\n"
    );
    let exported = text(&out.stdout);
    let lines: Vec<&str> = exported.lines().collect();
    assert_eq!(lines.len(), 1_501);
    assert_eq!(lines[0], "id,addr,server_name");
    // Sorted by id, every server name written out (imported empty: the host).
    assert!(lines[1..].windows(2).all(|w| w[0] < w[1]));
    assert_eq!(lines[1], "pos-0000,10.0.0.0:443,10.0.0.0");
    assert_eq!(lines[2], "pos-0001,pos-1.shop.example:8443,pos-1.example");

    // Into the same directory it changes nothing; into an empty one it makes the same.
    let back = write(dir.path(), "export.csv", &exported);
    let out = ok(&url, &["import", "--replace", back.to_str().unwrap()]);
    assert!(out.contains("(0 added, 0 updated, 0 removed)"), "{out}");
    let other = RedisServer::start();
    ok(&other.url(), &["import", back.to_str().unwrap()]);
    let again = write(dir.path(), "again.csv", "");
    let out = ok(
        &other.url(),
        &["export", "--output", again.to_str().unwrap()],
    );
    assert_eq!(
        out,
        format!(
            "exported 1500 terminals from 64 shards to {}\n",
            again.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&again).unwrap(), exported);
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(leftovers, 3, "no temporary file left beside the export");

    // An entry edited behind posgate's back is exported as stored and named; the
    // command fails, and an import of the file refuses exactly that line.
    let shard = posgate::core::shard::shard_of("pos-0002", 64);
    let key = format!("posgate:{{default}}:terminals:{shard}");
    let bad = r#"{"addr":"10.0.0.2","server_name":"x,y"}"#;
    assert_eq!(redis.command(&["HSET", &key, "pos-0002", bad]), ":0");
    let out = terminals(&url, &["export"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("invalid stored terminal \"pos-0002\": ")
            && stderr.contains("1 stored terminal(s) are not valid"),
        "{stderr}"
    );
    let exported = text(&out.stdout);
    assert!(
        exported.contains("\npos-0002,10.0.0.2,\"x,y\"\n"),
        "{exported}"
    );
    let file = write(dir.path(), "tampered.csv", &exported);
    let out = terminals(&url, &["import", file.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(":4: ") && stderr.contains("1 invalid line(s)"),
        "{stderr}"
    );
}

/// A file with the `labels` column sets each terminal's labels (an empty cell removes
/// them) and exports back the same; a file without it, imported plainly or with
/// `--replace`, keeps the stored labels of the terminals it lists.
#[test]
fn labels_are_set_by_the_file_that_has_them_and_kept_by_one_that_does_not() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let labeled = "id,addr,server_name,labels\n\
                   pos-1,10.0.0.1:443,,store=17;region=eu\n\
                   pos-2,10.0.0.2:443,,store=18\n\
                   pos-3,10.0.0.3:443,,\n";
    let file = write(dir.path(), "labeled.csv", labeled);
    ok(&url, &["import", file.to_str().unwrap()]);
    let exported = ok(&url, &["export"]);
    assert_eq!(
        exported,
        "id,addr,server_name,labels\n\
         pos-1,10.0.0.1:443,10.0.0.1,region=eu;store=17\n\
         pos-2,10.0.0.2:443,10.0.0.2,store=18\n\
         pos-3,10.0.0.3:443,10.0.0.3,\n"
    );
    // No labels column: new addresses, the same labels; --replace too.
    let plain = "id,addr,server_name\n\
                 pos-1,10.0.1.1:443,\n\
                 pos-2,10.0.1.2:443,\n";
    let file = write(dir.path(), "plain.csv", plain);
    let out = ok(&url, &["import", file.to_str().unwrap()]);
    assert!(out.contains("(0 added, 2 updated, 0 removed)"), "{out}");
    let out = ok(&url, &["import", "--replace", file.to_str().unwrap()]);
    assert!(out.contains("(0 added, 0 updated, 1 removed)"), "{out}");
    assert_eq!(
        ok(&url, &["export"]),
        "id,addr,server_name,labels\n\
         pos-1,10.0.1.1:443,10.0.1.1,region=eu;store=17\n\
         pos-2,10.0.1.2:443,10.0.1.2,store=18\n"
    );
    // An empty cell removes them (the file read from standard input, `-`); a bad label
    // names its line and imports nothing.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_posgate"))
        .args(["terminals", "import", "-", "--redis-url", &url])
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(
        &mut stdin,
        b"id,addr,server_name,labels\npos-2,10.0.1.2:443,,\n",
    )
    .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("(0 added, 1 updated, 0 removed)"));
    let file = write(
        dir.path(),
        "bad.csv",
        "id,addr,server_name,labels\npos-1,10.0.1.1:443,,store=1\npos-2,10.0.1.2:443,,store\n",
    );
    let out = terminals(&url, &["import", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("bad.csv:3: label \"store\" is not key=value"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        ok(&url, &["export"]),
        "id,addr,server_name,labels\n\
         pos-1,10.0.1.1:443,10.0.1.1,region=eu;store=17\n\
         pos-2,10.0.1.2:443,10.0.1.2,\n"
    );
}
