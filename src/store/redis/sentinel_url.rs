//! The Sentinel form of `--redis-url`:
//!
//! ```text
//! redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/<master-name>[/<db>]
//! rediss+sentinel://...   (TLS to the sentinels and to the master)
//! ```
//!
//! The hosts are the sentinels (port 26379 when omitted); `master-name` is the name they
//! monitor the master under. The user and password (percent-encoded, as in any URL) are
//! the master's, and the sentinels' too unless they get their own
//! (`--redis-sentinel-password-file`). Parsed here because no URL library accepts a list
//! of hosts; the single-endpoint forms (`redis://`, `rediss://`) are the redis crate's.
//!
//! What it does not do: connect (`super::endpoint`), or read passwords from files
//! (`crate::config`).

use std::fmt;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

/// The port sentinels listen on by default.
pub const SENTINEL_PORT: u16 = 26379;

/// What must be percent-encoded in a user name or password (RFC 3986 userinfo).
const USERINFO: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b':')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}')
    .add(b',');

/// A parsed `redis+sentinel://` or `rediss+sentinel://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    pub tls: bool,
    pub username: Option<String>,
    pub password: Option<String>,
    /// The sentinels, as host and port, in the order given.
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub db: i64,
}

impl fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl SentinelUrl {
    /// Whether `url` is meant as a Sentinel URL (by its scheme), valid or not.
    pub fn is_sentinel(url: &str) -> bool {
        url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
    }

    /// Parses a Sentinel URL; the error says what is wrong without quoting the password.
    pub fn parse(url: &str) -> Result<SentinelUrl, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else {
            return Err("expected redis+sentinel:// or rediss+sentinel://".into());
        };
        if rest.contains(['?', '#']) {
            return Err("a Sentinel URL takes no query or fragment".into());
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        // The last `@` ends the user info: a password may hold an unencoded `@`.
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let decode = |s: &str, what: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| format!("the {what} is not valid UTF-8 once percent-decoded"))
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (info, None),
                };
                let user = Some(decode(user, "user name")?).filter(|u| !u.is_empty());
                let pass = pass.map(|p| decode(p, "password")).transpose()?;
                (user, pass.filter(|p| !p.is_empty()))
            }
        };
        let sentinels = hosts
            .split(',')
            .map(sentinel_addr)
            .collect::<Result<Vec<_>, _>>()?;
        let mut parts = path.split('/');
        let master = parts.next().unwrap_or_default();
        if master.is_empty() {
            return Err("the master name is missing: .../<master-name>".into());
        }
        let master = decode(master, "master name")?;
        let db = match parts.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| {
                    format!("the database after the master name is not a number: {db:?}")
                })?,
        };
        if parts.next().is_some() {
            return Err("expected .../<master-name>[/<db>]".into());
        }
        Ok(SentinelUrl {
            tls,
            username,
            password,
            sentinels,
            master,
            db,
        })
    }

    /// The URL again, with the password percent-encoded.
    pub fn to_url(&self) -> String {
        self.render(self.password.as_deref())
    }

    /// The URL with the password (if any) shown as `***`.
    pub fn redacted(&self) -> String {
        self.render(self.password.as_ref().map(|_| "***"))
    }

    fn render(&self, password: Option<&str>) -> String {
        let scheme = if self.tls {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let encode = |s: &str| utf8_percent_encode(s, USERINFO).to_string();
        let userinfo = match (&self.username, password) {
            (None, None) => String::new(),
            (user, Some("***")) => {
                format!("{}:***@", user.as_deref().map(encode).unwrap_or_default())
            }
            (user, Some(pass)) => format!(
                "{}:{}@",
                user.as_deref().map(encode).unwrap_or_default(),
                encode(pass)
            ),
            (Some(user), None) => format!("{}@", encode(user)),
        };
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(host, port)| {
                if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                }
            })
            .collect();
        let db = if self.db == 0 {
            String::new()
        } else {
            format!("/{}", self.db)
        };
        format!(
            "{scheme}://{userinfo}{}/{}{db}",
            hosts.join(","),
            encode(&self.master)
        )
    }
}

/// One `host[:port]` of the list; IPv6 hosts in brackets.
fn sentinel_addr(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed [ in sentinel address {s:?}"))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("bad sentinel address {s:?}")),
            },
        }
    } else {
        match s.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(format!("a sentinel address has no host: {s:?}"));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("bad port in sentinel address {s:?}"))?,
    };
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_lists_its_sentinels_master_and_credentials() {
        let url =
            SentinelUrl::parse("redis+sentinel://app:p%40ss,w@s1:26380,s2,[::1]:5000/mymaster/2")
                .unwrap();
        assert!(!url.tls);
        assert_eq!(url.username.as_deref(), Some("app"));
        assert_eq!(url.password.as_deref(), Some("p@ss,w"));
        assert_eq!(
            url.sentinels,
            [
                ("s1".to_string(), 26380),
                ("s2".to_string(), SENTINEL_PORT),
                ("::1".to_string(), 5000)
            ]
        );
        assert_eq!((url.master.as_str(), url.db), ("mymaster", 2));
        // Round trip, and the password never shown redacted.
        assert_eq!(SentinelUrl::parse(&url.to_url()).unwrap(), url);
        let shown = url.redacted();
        assert!(
            !shown.contains("p%40ss") && shown.contains(":***@"),
            "{shown}"
        );
        assert!(!format!("{url:?}").contains("ss,w"));
        let plain = SentinelUrl::parse("rediss+sentinel://h/m").unwrap();
        assert!(plain.tls && plain.password.is_none() && plain.db == 0);
        assert_eq!(plain.to_url(), "rediss+sentinel://h:26379/m");
    }

    #[test]
    fn bad_sentinel_urls_say_what_is_wrong_without_the_password() {
        for (url, why) in [
            ("redis://h/m", "expected redis+sentinel"),
            ("redis+sentinel://u:secret@h1:1", "master name is missing"),
            ("redis+sentinel://u:secret@h1:x/m", "bad port"),
            ("redis+sentinel://u:secret@h1:0/m", "bad port"),
            ("redis+sentinel://u:secret@,h2/m", "no host"),
            ("redis+sentinel://u:secret@h/m/-1", "not a number"),
            ("redis+sentinel://u:secret@h/m/1/2", "expected"),
            ("redis+sentinel://u:secret@h/m?db=1", "no query"),
            ("redis+sentinel://u:secret@[::1/m", "unclosed"),
        ] {
            let err = SentinelUrl::parse(url).unwrap_err();
            assert!(err.contains(why), "{url}: {err}");
            assert!(!err.contains("secret"), "{url}: {err}");
        }
    }
}
