//! A wall clock set off for one child process (a `redis-server` whose `TIME` and key
//! expiry must run behind the real clock), through a preload library built here.
//!
//! Why not libfaketime (Debian `faketime`): it cannot start a `redis-server` built with
//! jemalloc, which Debian's is. jemalloc reads the clock while the allocator initialises,
//! before libfaketime has resolved the real `clock_gettime`, and libfaketime gives up
//! ("Unexpected recursive calls to clock_gettime() without proper initialization",
//! libfaketime issue #130, open since 2018). The library here answers from the kernel
//! with raw system calls, so it needs no symbol lookup and allocates nothing: it works
//! from the first instruction. It shifts `gettimeofday`, `time` and
//! `clock_gettime(CLOCK_REALTIME*)` by `POSGATE_CLOCK_SHIFT_MS` milliseconds; monotonic
//! clocks are left alone (Redis times its own timeouts with them).
//!
//! Built once per test run with the `rustc` on `PATH` (the one that built the tests).
//!
//! Not for: anything but loopback test children; it knows x86_64 and aarch64 Linux.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The variable the library reads its shift (milliseconds, signed) from.
pub const SHIFT_ENV: &str = "POSGATE_CLOCK_SHIFT_MS";

const SOURCE: &str = r#"
use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::atomic::{AtomicI64, Ordering};

#[repr(C)]
pub struct Timespec { tv_sec: i64, tv_nsec: i64 }
#[repr(C)]
pub struct Timeval { tv_sec: i64, tv_usec: i64 }

extern "C" {
    fn syscall(n: c_long, ...) -> c_long;
    fn getenv(name: *const c_char) -> *const c_char;
}

#[cfg(target_arch = "x86_64")]
const CLOCK_GETTIME: c_long = 228;
#[cfg(target_arch = "x86_64")]
const GETTIMEOFDAY: c_long = 96;
#[cfg(target_arch = "aarch64")]
const CLOCK_GETTIME: c_long = 113;
#[cfg(target_arch = "aarch64")]
const GETTIMEOFDAY: c_long = 169;

const UNREAD: i64 = i64::MIN;
static SHIFT_MS: AtomicI64 = AtomicI64::new(UNREAD);

/// The shift in ms; read once, without allocating.
fn shift_ms() -> i64 {
    let known = SHIFT_MS.load(Ordering::Relaxed);
    if known != UNREAD {
        return known;
    }
    let mut value: i64 = 0;
    unsafe {
        let p = getenv(b"POSGATE_CLOCK_SHIFT_MS\0".as_ptr() as *const c_char);
        if !p.is_null() {
            let (mut i, mut sign) = (0isize, 1i64);
            if *p == b'-' as c_char { sign = -1; i = 1; } else if *p == b'+' as c_char { i = 1; }
            while (*p.offset(i) as u8).is_ascii_digit() {
                value = value * 10 + (*p.offset(i) as u8 - b'0') as i64;
                i += 1;
            }
            value *= sign;
        }
    }
    SHIFT_MS.store(value, Ordering::Relaxed);
    value
}

fn shifted_ns(sec: i64, ns: i64) -> (i64, i64) {
    let total = (sec as i128) * 1_000_000_000 + ns as i128 + (shift_ms() as i128) * 1_000_000;
    ((total.div_euclid(1_000_000_000)) as i64, (total.rem_euclid(1_000_000_000)) as i64)
}

#[no_mangle]
pub unsafe extern "C" fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int {
    let r = syscall(CLOCK_GETTIME, clock as c_long, ts) as c_int;
    // CLOCK_REALTIME, CLOCK_REALTIME_COARSE.
    if r == 0 && !ts.is_null() && (clock == 0 || clock == 5) {
        let (s, n) = shifted_ns((*ts).tv_sec, (*ts).tv_nsec);
        (*ts).tv_sec = s;
        (*ts).tv_nsec = n;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn gettimeofday(tv: *mut Timeval, tz: *mut c_void) -> c_int {
    let r = syscall(GETTIMEOFDAY, tv, tz) as c_int;
    if r == 0 && !tv.is_null() {
        let (s, n) = shifted_ns((*tv).tv_sec, (*tv).tv_usec * 1000);
        (*tv).tv_sec = s;
        (*tv).tv_usec = n / 1000;
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn time(t: *mut i64) -> i64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    clock_gettime(0, &mut ts);
    if !t.is_null() {
        *t = ts.tv_sec;
    }
    ts.tv_sec
}
"#;

/// The preload library, built on first use.
pub fn library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("posgate-clock-shift-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the clock shift library");
        let source = dir.join("clock_shift.rs");
        let library = dir.join("libclock_shift.so");
        std::fs::write(&source, SOURCE).expect("write the clock shift source");
        let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
            .args([
                "--edition",
                "2021",
                "--crate-type",
                "cdylib",
                "-C",
                "opt-level=1",
            ])
            .args(["-C", "panic=abort", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .expect("run rustc to build the clock shift library");
        assert!(
            out.status.success(),
            "building the clock shift library failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        library
    })
}

/// `cmd` run with its wall clock `offset_secs` off the real one.
pub fn shift(cmd: &mut Command, offset_secs: i64) {
    cmd.env("LD_PRELOAD", library())
        .env(SHIFT_ENV, (offset_secs * 1000).to_string());
}
