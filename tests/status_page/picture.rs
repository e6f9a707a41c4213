//! What the status page drew, read back from the DOM Chromium dumped (the SVG elements'
//! attributes), and checked against `/v1/cluster` as the test read it just before and
//! just after the browser did: every shard's segment (owner, assigned pod, state, fill),
//! the legend's colours, the per-pod bars with their queued pushes and the timeline's
//! series.
//!
//! A shard may change while the browser renders (a rebalance goes on), so each drawn
//! value must be what one of the two views says; where they agree, it is exactly that.
//!
//! Not for: starting pods or the browser (`super`), or what a scenario expects (its test).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::support::pod::SHARDS;

/// The attributes of each `<tag ...>` start tag of `dom`, in document order.
pub fn elements(dom: &str, tag: &str) -> Vec<BTreeMap<String, String>> {
    let open = format!("<{tag} ");
    let mut found = Vec::new();
    let mut rest = dom;
    while let Some(at) = rest.find(&open) {
        let head = &rest[at + open.len()..];
        let end = head.find('>').expect("a closed start tag");
        found.push(attributes(&head[..end]));
        rest = &head[end..];
    }
    found
}

/// `name="value"` pairs of a start tag (Chromium quotes every value with `"`).
fn attributes(mut text: &str) -> BTreeMap<String, String> {
    let mut attrs = BTreeMap::new();
    while let Some(eq) = text.find("=\"") {
        let name = text[..eq].trim().to_string();
        let value_and_rest = &text[eq + 2..];
        let close = value_and_rest.find('"').expect("a closed attribute value");
        let value = value_and_rest[..close].replace("&amp;", "&");
        attrs.insert(name, value);
        text = &value_and_rest[close + 1..];
    }
    attrs
}

/// One shard as the page drew it: the inner segment (lease holder) and the outer one
/// (the placement's choice).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub owner: String,
    pub assigned: String,
    pub state: String,
    pub fill: String,
    pub assigned_fill: String,
}

/// A per-pod bar: terminals counted, and shards not counted; pushes with a TTL waiting
/// and the oldest one's age (`None`: unknown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bar {
    pub connected: u64,
    pub expected: u64,
    pub connected_unknown: u64,
    pub expected_unknown: u64,
    pub queued: Option<u64>,
    pub oldest_ms_ago: Option<u64>,
}

/// A timeline series: how many points, the latest value.
#[derive(Clone, Debug)]
pub struct Series {
    pub points: usize,
    pub last: Option<f64>,
}

/// The whole picture.
#[derive(Debug)]
pub struct Picture {
    /// Index = shard.
    pub segments: Vec<Segment>,
    /// Pod -> colour, and the legend's text per pod.
    pub legend: BTreeMap<String, (String, String)>,
    pub bars: BTreeMap<String, Bar>,
    pub series: BTreeMap<String, Series>,
}

impl Picture {
    /// The shards drawn in `state`.
    pub fn in_state(&self, state: &str) -> Vec<u32> {
        (0..SHARDS)
            .filter(|&s| self.segments[s as usize].state == state)
            .collect()
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The state the page must draw for shard view `s` (`docs/operations.md`).
pub fn state_of(s: &Value) -> &'static str {
    if s["suspended"] == Value::Bool(true) {
        "suspended"
    } else if s["owner"].is_null() {
        "unowned"
    } else if s["assigned"] != s["owner"] {
        "moving"
    } else if s["next_owner"].is_string() {
        "waiting"
    } else {
        "served"
    }
}

/// The picture in `dom`, checked against the views read before and after it.
pub fn read_and_check(dom: &str, before: &Value, after: &Value) -> Picture {
    let mut segments: Vec<Option<Segment>> = vec![None; SHARDS as usize];
    let paths = elements(dom, "path");
    let mut assigned_fill = BTreeMap::new();
    for p in paths
        .iter()
        .filter(|p| p.get("class").is_some_and(|c| c == "assigned"))
    {
        assigned_fill.insert(p["data-shard"].parse::<usize>().unwrap(), p["fill"].clone());
    }
    let segs: Vec<_> = paths
        .iter()
        .filter(|p| p.get("class").is_some_and(|c| c.starts_with("seg ")))
        .filter(|p| p.contains_key("data-shard"))
        .collect();
    assert_eq!(segs.len(), SHARDS as usize, "one segment per shard: {dom}");
    assert_eq!(
        assigned_fill.len(),
        SHARDS as usize,
        "one outer segment per shard"
    );
    for p in segs {
        let shard: usize = p["data-shard"].parse().unwrap();
        assert!(segments[shard].is_none(), "shard {shard} drawn twice");
        assert_eq!(p["class"], format!("seg {}", p["data-state"]), "{p:?}");
        segments[shard] = Some(Segment {
            owner: p["data-owner"].clone(),
            assigned: p["data-assigned"].clone(),
            state: p["data-state"].clone(),
            fill: p["fill"].clone(),
            assigned_fill: assigned_fill[&shard].clone(),
        });
    }
    let segments: Vec<Segment> = segments.into_iter().map(Option::unwrap).collect();

    let legend: BTreeMap<String, (String, String)> = elements(dom, "li")
        .into_iter()
        .filter_map(|li| {
            Some((
                li.get("data-legend-pod")?.clone(),
                li.get("data-colour")?.clone(),
            ))
        })
        .map(|(pod, colour)| {
            let at = dom.find(&format!("data-legend-pod=\"{pod}\"")).unwrap();
            let item = &dom[at..at + dom[at..].find("</li>").unwrap()];
            let words = item[item.rfind("</svg>").unwrap() + 6..].to_string();
            (pod, (colour, words))
        })
        .collect();
    let colours: BTreeSet<&String> = legend.values().map(|(c, _)| c).collect();
    assert_eq!(colours.len(), legend.len(), "a colour per pod: {legend:?}");

    let views = [before, after];
    let mut named = BTreeSet::new();
    for (shard, seg) in segments.iter().enumerate() {
        let drawn = (
            seg.owner.as_str(),
            seg.assigned.as_str(),
            seg.state.as_str(),
        );
        let read: Vec<_> = views
            .iter()
            .map(|v| {
                let s = &v["shards"][shard];
                (text(&s["owner"]), text(&s["assigned"]), state_of(s))
            })
            .collect();
        assert!(
            read.iter()
                .any(|(o, a, st)| (o.as_str(), a.as_str(), *st) == drawn),
            "shard {shard} drawn as {drawn:?}, /v1/cluster said {read:?}"
        );
        let colour = |pod: &str| legend.get(pod).map(|(c, _)| c.as_str());
        if seg.owner.is_empty() {
            assert_eq!(seg.fill, "url(#hatch)", "unowned shard {shard} is hatched");
        } else {
            assert_eq!(Some(seg.fill.as_str()), colour(&seg.owner), "shard {shard}");
            named.insert(seg.owner.clone());
        }
        if !seg.assigned.is_empty() {
            let outer = Some(seg.assigned_fill.as_str());
            assert_eq!(outer, colour(&seg.assigned), "shard {shard}'s outer ring");
            named.insert(seg.assigned.clone());
        }
    }
    for v in views {
        for m in v["members"].as_array().unwrap() {
            named.insert(text(&m["pod"]));
        }
    }
    let legend_pods: BTreeSet<String> = legend.keys().cloned().collect();
    assert_eq!(legend_pods, named, "the legend names every pod drawn");

    let bars = bars(dom);
    assert_eq!(bars.keys().cloned().collect::<BTreeSet<_>>(), legend_pods);
    for (pod, bar) in &bars {
        let sums: Vec<Bar> = views.iter().map(|v| bar_of(v, pod)).collect();
        // The oldest push's age grows between the reads: the drawn one lies between.
        let aged = |read: &Bar| Bar {
            oldest_ms_ago: bar.oldest_ms_ago,
            ..read.clone()
        };
        assert!(
            sums.iter().map(aged).any(|read| read == *bar),
            "{pod}'s bar {bar:?}, /v1/cluster said {sums:?}"
        );
        if let Some(age) = bar.oldest_ms_ago {
            let (low, high) = (sums[0].oldest_ms_ago, sums[1].oldest_ms_ago);
            assert!(
                low.unwrap_or(0) <= age && age <= high.unwrap_or(u64::MAX),
                "{pod}'s oldest push drawn {age} ms old, /v1/cluster said {sums:?}"
            );
        }
    }

    let series = elements(dom, "polyline")
        .into_iter()
        .map(|p| {
            let s = Series {
                points: p["data-points"].parse().unwrap(),
                last: p["data-last"].parse().ok(),
            };
            (p["data-series"].clone(), s)
        })
        .collect();
    Picture {
        segments,
        legend,
        bars,
        series,
    }
}

/// The per-pod bars drawn in `dom`, by pod.
pub fn bars(dom: &str) -> BTreeMap<String, Bar> {
    let number = |g: &BTreeMap<String, String>, name: &str| -> u64 {
        g[name]
            .parse()
            .unwrap_or_else(|_| panic!("{name} of {g:?}"))
    };
    // Empty when unknown.
    let maybe = |g: &BTreeMap<String, String>, name: &str| -> Option<u64> {
        (!g[name].is_empty()).then(|| number(g, name))
    };
    elements(dom, "g")
        .into_iter()
        .filter(|g| g.get("class").is_some_and(|c| c == "bar"))
        .map(|g| {
            let bar = Bar {
                connected: number(&g, "data-connected"),
                expected: number(&g, "data-expected"),
                connected_unknown: number(&g, "data-connected-unknown"),
                expected_unknown: number(&g, "data-expected-unknown"),
                queued: maybe(&g, "data-queued"),
                oldest_ms_ago: maybe(&g, "data-queued-oldest-ms"),
            };
            (g["data-pod"].clone(), bar)
        })
        .collect()
}

/// Whether the page's own read of `/v1/cluster` missed a peer's counts that both of the
/// test's reads had: a bar with more shards uncounted than either view implies, or its
/// queue unknown where both knew it. The
/// answering pod gives each peer 500 ms (`src/http/cluster.rs`); on a loaded machine,
/// with the browser starting beside the pods, one can miss it for the page alone.
pub fn missed_a_peer(dom: &str, before: &Value, after: &Value) -> bool {
    bars(dom).iter().any(|(pod, bar)| {
        [before, after].iter().all(|v| {
            let read = bar_of(v, pod);
            bar.connected_unknown > read.connected_unknown
                || bar.expected_unknown > read.expected_unknown
                || (bar.queued.is_none() && read.queued.is_some())
        })
    })
}

/// `pod`'s bar as `view` implies it: connected terminals of the shards it holds,
/// listed ones of the shards assigned to it, and the shards without a count; its queue
/// as the member says (unknown for a pod that is not one, or did not say).
pub fn bar_of(view: &Value, pod: &str) -> Bar {
    let queue = view["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["pod"] == pod)
        .map(|m| &m["queue"]);
    let mut bar = Bar {
        connected: 0,
        expected: 0,
        connected_unknown: 0,
        expected_unknown: 0,
        queued: queue.and_then(|q| q["pushes"].as_u64()),
        oldest_ms_ago: queue.and_then(|q| q["oldest_ms_ago"].as_u64()),
    };
    for s in view["shards"].as_array().unwrap() {
        if s["owner"] == pod {
            match s["terminals_connected"].as_u64() {
                Some(n) => bar.connected += n,
                None => bar.connected_unknown += 1,
            }
        }
        if s["assigned"] == pod {
            match s["terminals_listed"].as_u64() {
                Some(n) => bar.expected += n,
                None => bar.expected_unknown += 1,
            }
        }
    }
    bar
}
