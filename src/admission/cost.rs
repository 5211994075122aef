//! What reading a review into JSON values costs in memory, found before reading it.
//!
//! A body is cheap to hold, but the values read from it are not: a JSON object with
//! one member becomes a B-tree node of about 700 bytes, so a list of `{"a":1}` costs
//! about 90 times its size, and 16 to 30 times is common. The memory budget is
//! charged by this estimate, an upper bound of what [`super::review::parse`]
//! allocates, so that the bodies being decided at once stay within it however many
//! workers read them. A byte walk finds it, without allocating, and, as the reader
//! does, leaves out what the reader skips unparsed: `status`, `managedFields` and,
//! in a Pod, all of its spec but what admission reads or patches: it asks the
//! reader's own rule, [`crate::lenient::member`].
//!
//! A small review is not walked first: it is read at once, the reader counting
//! what it builds in the same units ([`crate::lenient::Meter`]) and stopping once
//! that passes what takes nothing from the budget. Only then is it walked.

use crate::lenient::{ARRAY, ITEM, Level, Member, OBJECT, Skip, member, text};

/// How deep the walk counts what the reader reads: serde_json refuses JSON nested
/// deeper than 128 (counted from the object, which the reader takes on its own a
/// few levels into the review), so nothing deeper is ever read. Past it, the walk
/// counts only the depth, as in what the reader skips, and so costs the same for
/// a body of a million `[`; what follows the deep part still counts (the reader
/// refuses that object, not the next one).
const READ_DEPTH: usize = 128 + 8;

/// What a value is, as far as the reader's skipping goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The review itself.
    Review,
    /// `request`.
    Request,
    /// `request.kind`.
    Kind,
    /// `request.kind.kind` and `request.kind.group`, which say whether the object
    /// is a core Pod.
    KindName,
    KindGroup,
    /// `request.object` or `request.oldObject` (at [`Level::Top`]), or an object
    /// in it the reader reads at a level of its own.
    Object(Level),
    /// A Pod's list of containers (or init or ephemeral containers).
    Containers,
    /// Anything else that is read.
    Other,
    /// Skipped unparsed.
    Skipped,
}

/// The role of the member `key` of an object with role `parent`; in the object,
/// what the reader skips of a core Pod when `pod`, else of any object.
fn member_role(parent: Role, key: &[u8], pod: bool) -> Role {
    let skip = if pod {
        Skip::PodContainerDetail
    } else {
        Skip::Status
    };
    match (parent, key) {
        (Role::Skipped, _) => Role::Skipped,
        (Role::Review, b"request") => Role::Request,
        (Role::Request, b"kind") => Role::Kind,
        (Role::Kind, b"kind") => Role::KindName,
        (Role::Kind, b"group") => Role::KindGroup,
        (Role::Request, b"object" | b"oldObject") => Role::Object(Level::Top),
        (Role::Object(level), key) => match member(level, key, skip) {
            Member::Skipped => Role::Skipped,
            Member::Object(level) => Role::Object(level),
            Member::Containers => Role::Containers,
            Member::Read => Role::Other,
        },
        _ => Role::Other,
    }
}

/// The role of an element of an array with role `array`.
fn element_role(array: Role) -> Role {
    match array {
        Role::Skipped => Role::Skipped,
        Role::Containers => Role::Object(Level::Container),
        _ => Role::Other,
    }
}

/// An object or array being walked.
struct Open {
    role: Role,
    object: bool,
    /// Whether it has a member or element yet: an empty one allocates nothing.
    filled: bool,
    /// In an object: a key comes next.
    expect_key: bool,
    /// In an object: the role of the member whose key was read last.
    member: Role,
}

/// The walk: the containers open, the cost so far, and what `request.kind` says of
/// the object under review, which the apiserver writes before the object; until
/// it says a core Pod, containers count whole.
struct Walk {
    open: Vec<Open>,
    /// How deep the walk is within the innermost skipped container it opened.
    skipped_depth: usize,
    cost: usize,
    /// `request.kind.kind` is `Pod`.
    pod_kind: bool,
    /// `request.kind.group` is another group than the core one (absent is core).
    other_group: bool,
}

impl Walk {
    /// Whether the object is a core Pod, whose container details the reader skips.
    fn pod(&self) -> bool {
        self.pod_kind && !self.other_group
    }

    /// A value starts: its role, with its slot in its container charged.
    fn value(&mut self) -> Role {
        let Some(parent) = self.open.last_mut() else {
            return Role::Review;
        };
        let role = if parent.object {
            parent.member
        } else {
            element_role(parent.role)
        };
        if role != Role::Skipped {
            self.cost += ITEM;
        }
        if !parent.filled && parent.role != Role::Skipped {
            self.cost += if parent.object { OBJECT } else { ARRAY };
        }
        parent.filled = true;
        role
    }
}

/// The memory reading `body` into JSON values takes, at most (see the module
/// comment). Malformed JSON is costed as far as it goes: the reader refuses it.
pub fn parse_cost(body: &[u8]) -> usize {
    let mut walk = Walk {
        open: Vec::new(),
        skipped_depth: 0,
        cost: 0,
        pod_kind: false,
        other_group: false,
    };
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let start = i + 1;
                let mut escaped = false;
                // To the closing quote, jumping over plain text (most of a body).
                i = start;
                while i < body.len() {
                    match memchr::memchr2(b'"', b'\\', &body[i..]) {
                        Some(at) if body[i + at] == b'"' => {
                            i += at;
                            break;
                        }
                        Some(at) => {
                            escaped = true;
                            i += at + 2;
                        }
                        None => i = body.len(),
                    }
                }
                let quoted = &body[start..i.min(body.len())];
                let pod = walk.pod();
                match walk.open.last_mut() {
                    Some(open) if open.object && open.expect_key => {
                        // A key with escapes may spell any name once read
                        // (`"n\u0061me"` is `name`), so what follows it is counted
                        // unless all around it is skipped, and in `request.kind`
                        // (`"gr\u006fup"`) the object is taken for one whose
                        // containers are read whole: the estimate stays a bound.
                        open.member = match (escaped, open.role) {
                            (_, Role::Skipped) => Role::Skipped,
                            (true, Role::Kind) => Role::KindGroup,
                            (true, _) => Role::Other,
                            (false, role) => member_role(role, quoted, pod),
                        };
                        if open.member != Role::Skipped {
                            walk.cost += text(quoted.len());
                        }
                    }
                    _ => {
                        let role = walk.value();
                        if role != Role::Skipped {
                            walk.cost += text(quoted.len());
                        }
                        match role {
                            Role::KindName => walk.pod_kind = quoted == b"Pod",
                            // Sticky: an escaped key that may be `group` says so.
                            Role::KindGroup => walk.other_group |= !quoted.is_empty(),
                            _ => {}
                        }
                    }
                }
            }
            byte @ (b'{' | b'[') => {
                let role = walk.value();
                if role == Role::Skipped && walk.open.last().is_some_and(|o| o.role == role) {
                    // Within what the reader skips only the depth matters: a
                    // `managedFields` nested a million deep costs one counter.
                    walk.skipped_depth += 1;
                    i += 1;
                    continue;
                }
                // Past the depth the reader reads, only the depth counts.
                let role = if walk.open.len() >= READ_DEPTH {
                    Role::Skipped
                } else {
                    role
                };
                let object = byte == b'{';
                walk.open.push(Open {
                    role,
                    object,
                    filled: false,
                    expect_key: object,
                    member: Role::Other,
                });
            }
            b'}' | b']' => {
                if walk.skipped_depth > 0 {
                    walk.skipped_depth -= 1;
                } else {
                    walk.open.pop();
                }
            }
            b':' => {
                if let Some(open) = walk.open.last_mut() {
                    open.expect_key = false;
                }
            }
            b',' => {
                if let Some(open) = walk.open.last_mut() {
                    open.expect_key = open.object;
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => {
                // A number or a literal, read whole.
                let start = i;
                while i + 1 < body.len() && !b",]} \t\n\r".contains(&body[i + 1]) {
                    i += 1;
                }
                if walk.value() != Role::Skipped {
                    walk.cost += text(i + 1 - start);
                }
            }
        }
        i += 1;
    }
    walk.cost
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(object: &str) -> String {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"operation":"CREATE","userInfo":{{"username":"t"}},"object":{object}}}}}"#
        )
    }

    /// Bytes this thread holds now, from jemalloc's own counters.
    fn held() -> u64 {
        let allocated = tikv_jemalloc_ctl::thread::allocatedp::read().unwrap().get();
        let freed = tikv_jemalloc_ctl::thread::deallocatedp::read()
            .unwrap()
            .get();
        allocated - freed
    }

    /// What reading `body` really allocates.
    fn real_cost(body: &str) -> u64 {
        let before = held();
        let parsed = crate::admission::review::parse(body.as_bytes()).expect("a review");
        let after = held();
        drop(parsed);
        after - before
    }

    fn many(item: &str, n: usize) -> String {
        format!("[{}]", vec![item; n].join(","))
    }

    #[test]
    fn the_estimate_bounds_what_reading_costs_for_every_shape() {
        let n = 5000;
        let keys = |value: &str| {
            let members: Vec<String> = (0..n).map(|i| format!(r#""k{i}":{value}"#)).collect();
            format!("{{{}}}", members.join(","))
        };
        let nested_arrays = format!("{}1{}", "[".repeat(60), "]".repeat(60));
        let nested_objects = format!("{}1{}", r#"{"a":"#.repeat(60), "}".repeat(60));
        let shapes = [
            (
                "empty objects",
                format!(r#"{{"spec":{{"tolerations":{}}}}}"#, many("{}", n)),
            ),
            (
                "one-member objects",
                format!(r#"{{"spec":{{"tolerations":{}}}}}"#, many(r#"{"a":1}"#, n)),
            ),
            (
                "two levels",
                format!(
                    r#"{{"spec":{{"tolerations":{}}}}}"#,
                    many(r#"{"a":{"b":1}}"#, n)
                ),
            ),
            (
                "numbers",
                format!(r#"{{"spec":{{"nodeSelector":{}}}}}"#, many("1", n)),
            ),
            (
                "empty strings",
                format!(r#"{{"spec":{{"nodeSelector":{}}}}}"#, many(r#""""#, n)),
            ),
            (
                "empty arrays",
                format!(r#"{{"spec":{{"nodeSelector":{}}}}}"#, many("[]", n)),
            ),
            (
                "one-element arrays",
                format!(r#"{{"spec":{{"nodeSelector":{}}}}}"#, many("[1]", n)),
            ),
            (
                "many keys",
                format!(r#"{{"spec":{{"nodeSelector":{}}}}}"#, keys("1")),
            ),
            (
                "many annotations",
                format!(r#"{{"metadata":{{"annotations":{}}}}}"#, keys(r#""""#)),
            ),
            (
                "a long string",
                format!(
                    r#"{{"metadata":{{"annotations":{{"a":"{}"}}}}}}"#,
                    "x".repeat(100_000)
                ),
            ),
            (
                "escaped strings",
                format!(
                    r#"{{"metadata":{{"annotations":{{"a":"{}"}}}}}}"#,
                    r"\u003c".repeat(10_000)
                ),
            ),
            (
                "nested arrays",
                format!(r#"{{"spec":{{"affinity":{}}}}}"#, many(&nested_arrays, 200)),
            ),
            (
                "nested objects",
                format!(
                    r#"{{"spec":{{"affinity":{}}}}}"#,
                    many(&nested_objects, 200)
                ),
            ),
            (
                "an escaped key the reader keeps",
                format!(
                    r#"{{"spec":{{"containers":[{{"name":"c","resourc\u0065s":{}}}]}}}}"#,
                    many(r#"{"a":1}"#, n)
                ),
            ),
            (
                "container resources",
                format!(
                    r#"{{"spec":{{"containers":{}}}}}"#,
                    many(
                        r#"{"name":"c","image":"i","resources":{"requests":{"cpu":"1"}}}"#,
                        500
                    )
                ),
            ),
        ];
        // Only a core Pod's container details are skipped: a "Pod" of another
        // group is read whole.
        let env = format!(
            r#"{{"spec":{{"containers":[{{"name":"c","env":{}}}]}}}}"#,
            many(r#"{"a":1}"#, n)
        );
        let kind = r#""kind":{"group":"","version":"v1","kind":"Pod"}"#;
        let other_group =
            review(&env).replace(kind, r#""kind":{"group":"x","version":"v1","kind":"Pod"}"#);
        let escaped_group = review(&env).replace(
            kind,
            r#""kind":{"gr\u006fup":"x","version":"v1","kind":"Pod"}"#,
        );
        let as_json =
            |body: &str| body.replace(kind, r#""kind":{"group":"x","version":"v1","kind":"Pod"}"#);
        // An object too deep to read is refused, but the review's other object is
        // read whole.
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let after_deep = as_json(&review(&format!(
            r#"{{"spec":{{"affinity":{deep}}}}},"oldObject":{{"spec":{{"nodeSelector":{}}}}}"#,
            many(r#"{"a":1}"#, n)
        )));
        // Each shape as a core Pod, read into berth's view of a pod (or, when its
        // fields have the wrong shape for that, as JSON), and as an object of
        // another group, read as JSON.
        let bodies = shapes
            .into_iter()
            .flat_map(|(what, object)| {
                let pod = review(&object);
                [
                    (what.to_string(), false, as_json(&pod)),
                    (what.to_string(), true, pod),
                ]
            })
            .chain([
                ("a Pod of another group".to_string(), false, other_group),
                (
                    "a Pod of another group, its key escaped".to_string(),
                    false,
                    escaped_group,
                ),
            ]);
        let mut pods_in_one_pass = Vec::new();
        for (what, pod, body) in bodies {
            let (estimate, real) = (parse_cost(body.as_bytes()) as u64, real_cost(&body));
            assert!(
                estimate >= real,
                "{what}: estimated {estimate}, read {real}"
            );
            // The reader's own count bounds what it builds too, and is never more
            // than the walk's.
            let Ok((_, built)) = crate::admission::review::read_within(body.as_bytes(), usize::MAX)
            else {
                assert!(pod, "{what}: JSON is read in one pass");
                continue;
            };
            let built = built as u64;
            assert!(
                (real..=estimate).contains(&built),
                "{what}: counted {built}, read {real}, estimated {estimate}"
            );
            if pod {
                pods_in_one_pass.push(what);
            } else {
                // The walk follows the JSON read closely; a pod's view, which
                // keeps less, it only bounds.
                assert!(
                    estimate <= 16 * real + 16_384,
                    "{what}: estimated {estimate}, read only {real}"
                );
            }
        }
        // Every shape a pod's view can hold is read into it in one pass.
        for what in [
            "empty objects",
            "one-member objects",
            "two levels",
            "many annotations",
            "a long string",
            "escaped strings",
            "container resources",
        ] {
            assert!(pods_in_one_pass.iter().any(|w| w == what), "{what}");
        }
        let (estimate, real) = (
            parse_cost(after_deep.as_bytes()) as u64,
            real_cost(&after_deep),
        );
        assert!(real > 1 << 20, "the old object is read: {real}");
        assert!(estimate >= real, "estimated {estimate}, read {real}");
    }

    #[test]
    fn what_the_reader_skips_costs_nothing() {
        let env = many(r#"{"name":"a","value":"b"}"#, 20_000);
        let pod = review(&format!(
            r#"{{"metadata":{{"name":"p","managedFields":{env}}},"status":{{"x":{env}}},
            "spec":{{"containers":[{{"name":"c","image":"nginx","env":{env}}}],"volumes":{env}}}}}"#
        ));
        assert!(
            parse_cost(pod.as_bytes()) < 16_384,
            "{}",
            parse_cost(pod.as_bytes())
        );
        // Container details count in objects that are not Pods: they are read.
        let daemonset = pod.replace(r#""kind":"Pod""#, r#""kind":"DaemonSet""#);
        assert!(parse_cost(daemonset.as_bytes()) > 1 << 20);
    }

    /// Bytes this thread allocates while `f` runs (what it frees not subtracted).
    fn allocated_by(f: impl FnOnce() -> usize) -> u64 {
        let before = tikv_jemalloc_ctl::thread::allocatedp::read().unwrap().get();
        std::hint::black_box(f());
        tikv_jemalloc_ctl::thread::allocatedp::read().unwrap().get() - before
    }

    #[test]
    fn nesting_costs_the_walk_nothing_past_what_the_reader_reads() {
        let deep = |open: &str| "[".repeat(1_000_000) + open;
        // Deeper than the reader goes, the walk stops: the reader refuses it.
        let object = review(&deep("1"));
        assert!(crate::admission::review::parse(object.as_bytes()).is_err());
        assert!(allocated_by(|| parse_cost(object.as_bytes())) < 64 * 1024);
        // What the reader skips may be nested as deep as it likes and is costed
        // by a counter; the review is read, and what follows it still counts.
        let skipped = format!(
            r#"{{"metadata":{{"name":"p","managedFields":[{}{}]}},"spec":{{"nodeName":"{}"}}}}"#,
            "[".repeat(1_000_000),
            "]".repeat(1_000_000),
            "y".repeat(100_000)
        );
        let skipped = review(&skipped);
        assert!(crate::admission::review::parse(skipped.as_bytes()).is_ok());
        assert!(allocated_by(|| parse_cost(skipped.as_bytes())) < 64 * 1024);
        assert!(parse_cost(skipped.as_bytes()) >= 200_000, "the spec counts");
    }
}
