//! The status page (`GET /`) rendered by a real browser: a pod on the embedded store,
//! headless Chromium loading the page with a token in the URL fragment, and checks on
//! the rendered DOM (members, 64 shard rows with owners and epochs). Chromium is the
//! Debian package `chromium` (`scripts/test` installs it); without it the test says so
//! and passes, as the browser is a test tool, not part of posgate, except under
//! `CI=true`, where it fails (`support::tools`).
//!
//! `POSGATE_SCREENSHOT=path.png` also saves a screenshot (how `docs/status-page.png`
//! was made).

use std::process::Command;
use std::time::Duration;

use posgate::credentials::ApiTokens;
use posgate::pod::Pod;
use posgate::store::memory::MemoryStore;

use crate::support::pod;
use crate::support::wait::wait_for;

const TOKEN: &str = "status-page-token-0123456789";

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|bin| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn headless(bin: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        // Lets the page's fetch and its first renders run before the DOM is dumped.
        "--virtual-time-budget=3000",
    ]);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_the_ring() {
    let unchecked = "the status page not rendered";
    let install = "Debian package chromium; scripts/test installs it";
    let Some(bin) = crate::support::tools::require(chromium(), "chromium", unchecked, install)
    else {
        return;
    };
    let (listener, url) = pod::listen().await;
    let mut config = pod::config("page-pod", &url);
    config.api_tokens = Some(ApiTokens::from_env_value(&format!("ops:{TOKEN}")).unwrap());
    let mut pod = Pod::start(config, MemoryStore::new(), listener, ()).unwrap();
    wait_for("the pod to be ready", Duration::from_secs(20), || {
        pod.status.borrow().ready
    })
    .await;

    let page = format!("{url}/#token={TOKEN}");
    let dump = tokio::task::spawn_blocking({
        let (bin, page) = (bin.to_string(), page.clone());
        move || headless(&bin).arg("--dump-dom").arg(page).output().unwrap()
    })
    .await
    .unwrap();
    let dom = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let rows = dom.matches("<tr").count();
    eprintln!(
        "[page] rendered {rows} table rows, {} bytes of DOM",
        dom.len()
    );
    // The header row plus one row per shard.
    assert_eq!(rows, 65, "{dom}");
    assert!(dom.contains("as seen by page-pod"), "{dom}");
    assert!(dom.contains("1 members"), "{dom}");
    assert!(!dom.contains("class=\"error\""), "{dom}");
    // Every shard is served by the only pod: its name fills the owner column.
    assert!(dom.matches("<td>page-pod</td>").count() >= 128, "{dom}");

    // Without the token the page asks for one instead of showing data.
    let bare = tokio::task::spawn_blocking({
        let (bin, page) = (bin.to_string(), format!("{url}/"));
        move || headless(&bin).arg("--dump-dom").arg(page).output().unwrap()
    })
    .await
    .unwrap();
    let bare = String::from_utf8_lossy(&bare.stdout);
    assert!(
        bare.contains("class=\"error\">this pod needs an API token"),
        "{bare}"
    );
    assert!(!bare.contains("<td>page-pod</td>"), "{bare}");

    if let Ok(path) = std::env::var("POSGATE_SCREENSHOT") {
        let shot = headless(bin)
            .arg("--window-size=1100,1500")
            .arg(format!("--screenshot={path}"))
            .arg(&page)
            .output()
            .unwrap();
        assert!(shot.status.success());
        eprintln!("[page] screenshot saved to {path}");
    }
    pod.shutdown();
    pod.wait().await.unwrap();
}
