//! Noticing that mounted secret files changed, and the loop that reloads on `SIGHUP`
//! or on such a change.
//!
//! Kubernetes updates a Secret volume by writing the new files into a fresh directory
//! and swapping a symlink to it, so the watched paths never see a write event of their
//! own; and a file watcher on every platform is its own source of trouble. Instead, the
//! poller reads the files every `--reload-poll-interval` and compares a SHA-256 of each
//! file's content with the previous reading ([`FileWatch::observe`], a plain function of
//! the two readings: tested without files or clocks). The files are a few small PEM
//! and text files, so a reading costs next to nothing.
//!
//! A failed reload is not retried while the files stay as they are (it would fail the
//! same way and flood the log); the next change of any of them triggers the next try.

use std::path::{Path, PathBuf};

use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};

use super::Reloader;
use crate::config::ServeArgs;

/// One reading of the watched files: each path with the hash of its content, or `None`
/// when it could not be read (missing for a moment during a non-atomic update, say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprints {
    files: Vec<(PathBuf, Option<[u8; 32]>)>,
}

impl Fingerprints {
    /// A reading from given contents, in the order given.
    pub fn from_contents<'a>(
        contents: impl IntoIterator<Item = (&'a Path, Option<&'a [u8]>)>,
    ) -> Self {
        let files = contents
            .into_iter()
            .map(|(path, bytes)| (path.to_owned(), bytes.map(|b| Sha256::digest(b).into())))
            .collect();
        Fingerprints { files }
    }

    /// Reads `paths` now. Symlinks are followed, so a swapped `..data` link shows as
    /// new content.
    pub fn read(paths: &[PathBuf]) -> Self {
        let contents: Vec<_> = paths.iter().map(|p| (p, std::fs::read(p).ok())).collect();
        Fingerprints::from_contents(contents.iter().map(|(p, c)| (p.as_path(), c.as_deref())))
    }
}

/// The last reading of the watched files, to compare the next one with.
#[derive(Debug)]
pub struct FileWatch {
    last: Fingerprints,
}

impl FileWatch {
    pub fn new(baseline: Fingerprints) -> Self {
        FileWatch { last: baseline }
    }

    /// The paths whose content differs from the last reading (changed, appeared or
    /// vanished); `now` becomes the reading the next one is compared with.
    pub fn observe(&mut self, now: Fingerprints) -> Vec<PathBuf> {
        let changed = now
            .files
            .iter()
            .filter(|(path, hash)| {
                let before = self.last.files.iter().find(|(p, _)| p == path);
                before.is_none_or(|(_, old)| old != hash)
            })
            .map(|(path, _)| path.clone())
            .collect();
        self.last = now;
        changed
    }
}

/// Reloads `reloader` from `args` for every item of `hangups` (`SIGHUP`) and whenever
/// the poller finds a reloadable file changed since `baseline`; never ends. A
/// `--reload-poll-interval` of zero leaves only the signal.
///
/// `baseline` must be read before the pod first read the files (before
/// `ServeArgs::resolve`): a change in between is then reloaded once more, instead of
/// being taken for the content the pod already runs with.
pub async fn run(
    args: ServeArgs,
    reloader: Reloader,
    baseline: Fingerprints,
    hangups: impl Stream<Item = ()> + Unpin,
) {
    let paths = args.reloadable_files();
    let every = args.reload_poll_interval;
    let mut watch = FileWatch::new(baseline);
    let mut hangups = hangups.fuse();
    let mut ticks = (!every.is_zero() && !paths.is_empty()).then(|| {
        let start = tokio::time::Instant::now() + every;
        let mut ticks = tokio::time::interval_at(start, every);
        // After a stall, one check is enough; a burst of them would find nothing new.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    loop {
        let tick = async {
            match &mut ticks {
                Some(ticks) => ticks.tick().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(()) = hangups.next() => {
                // What the signal applies is the new baseline: the poller must not
                // apply the same change a second time.
                watch.observe(Fingerprints::read(&paths));
                let _ = reloader.reload_from_args(&args, "SIGHUP");
            }
            _ = tick => {
                let changed = watch.observe(Fingerprints::read(&paths));
                if !changed.is_empty() {
                    let names: Vec<_> = changed.iter().map(|p| p.display().to_string()).collect();
                    let trigger = format!("changed: {}", names.join(", "));
                    let _ = reloader.reload_from_args(&args, &trigger);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(files: &[(&str, Option<&str>)]) -> Fingerprints {
        Fingerprints::from_contents(
            files
                .iter()
                .map(|(p, c)| (Path::new(*p), c.map(str::as_bytes))),
        )
    }

    #[test]
    fn reports_exactly_the_files_whose_content_changed() {
        let mut watch = FileWatch::new(reading(&[("tokens", Some("a")), ("tls.crt", Some("x"))]));
        // Same content (a rewrite, a touched mtime, a re-created symlink): nothing.
        assert!(watch
            .observe(reading(&[("tokens", Some("a")), ("tls.crt", Some("x"))]))
            .is_empty());
        let changed = watch.observe(reading(&[("tokens", Some("a")), ("tls.crt", Some("y"))]));
        assert_eq!(changed, vec![PathBuf::from("tls.crt")]);
        // Reported once: the new content is the baseline now.
        assert!(watch
            .observe(reading(&[("tokens", Some("a")), ("tls.crt", Some("y"))]))
            .is_empty());
    }

    #[test]
    fn a_vanished_and_returned_file_is_a_change_each_time() {
        let mut watch = FileWatch::new(reading(&[("secret", Some("one"))]));
        assert_eq!(
            watch.observe(reading(&[("secret", None)])),
            vec![PathBuf::from("secret")]
        );
        assert!(watch.observe(reading(&[("secret", None)])).is_empty());
        assert_eq!(
            watch.observe(reading(&[("secret", Some("two"))])),
            vec![PathBuf::from("secret")]
        );
    }

    #[cfg(unix)]
    #[test]
    fn reads_through_a_swapped_symlink() {
        // The Kubernetes layout: file -> ..data/file, ..data -> a timestamped directory.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (version, content) in [("v1", "first"), ("v2", "second")] {
            std::fs::create_dir(root.join(version)).unwrap();
            std::fs::write(root.join(version).join("token"), content).unwrap();
        }
        std::os::unix::fs::symlink("v1", root.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/token", root.join("token")).unwrap();
        let paths = vec![root.join("token")];
        let mut watch = FileWatch::new(Fingerprints::read(&paths));
        std::os::unix::fs::symlink("v2", root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        assert_eq!(watch.observe(Fingerprints::read(&paths)), paths);
    }
}
