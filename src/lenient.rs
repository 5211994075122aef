//! Objects read leniently into JSON values, for what berth patches and checks:
//! `metadata.managedFields` (and, as asked, `status`, and of a pod's spec all but
//! what admission reads or patches) skipped unparsed, everything else kept as the
//! apiserver sent it.
//!
//! What the values cost in memory is counted as they are built, by a [`Meter`],
//! in the same units [`crate::admission::cost`] estimates before a read: a review
//! small enough is read at once within what costs nothing from the memory budget,
//! and the read stops, having built no more, as soon as it would cost more. A
//! pod's view, read into berth's own types rather than JSON values, is counted by
//! what it allocates ([`Meter::charge_allocated`]).

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Number, Value};

/// What each JSON value costs once read, at most (jemalloc size classes
/// included): an object (a B-tree node once it has a member), an array (its first
/// allocation of four slots), and each member or element (a value slot, doubled by
/// growth, and its share of further nodes). Strings and keys cost twice their
/// bytes at most.
pub const OBJECT: usize = 768;
pub const ARRAY: usize = 192;
pub const ITEM: usize = 128;

/// The cost of a string or key of `len` bytes, kept.
pub const fn text(len: usize) -> usize {
    len.saturating_mul(2)
}

/// What a read has built so far, against what it may build.
#[derive(Debug)]
pub struct Meter {
    spent: Cell<usize>,
    allowance: usize,
}

/// Why a read stopped on its [`Meter`].
const OVER_ALLOWANCE: &str = "the read would build more than it may";

impl Meter {
    /// A meter that never stops a read: for one already charged in full.
    pub fn unlimited() -> Meter {
        Meter::within(usize::MAX)
    }

    /// A meter that stops a read once it has built more than `allowance`.
    pub fn within(allowance: usize) -> Meter {
        Meter {
            spent: Cell::new(0),
            allowance,
        }
    }

    /// What the read has built so far.
    pub fn spent(&self) -> usize {
        self.spent.get()
    }

    /// Counts `cost` about to be built; an error once the allowance is passed.
    pub fn charge<E: Error>(&self, cost: usize) -> Result<(), E> {
        let spent = self.spent.get().saturating_add(cost);
        self.spent.set(spent);
        if spent > self.allowance {
            return Err(E::custom(OVER_ALLOWANCE));
        }
        Ok(())
    }

    /// Counts a string of `len` bytes about to be kept, in its slot.
    pub fn charge_text<E: Error>(&self, len: usize) -> Result<(), E> {
        self.charge(ITEM.saturating_add(text(len)))
    }

    /// Runs `read`, then counts what it allocated on this thread: for a read into
    /// typed values, whose cost no constant here says. The count is jemalloc's
    /// own (the bytes this thread allocated, freed since or not), so it is exact,
    /// but it comes once the read is done: a read may build more than its
    /// allowance before it is stopped. Only a small review (at most 64 KiB of
    /// JSON, one at a time per async worker) is read within an allowance, and
    /// what it built is dropped at once when it is over; a larger one is read once
    /// the walk's estimate is charged. Where jemalloc does not count, every read
    /// is over.
    pub fn charge_allocated<T, E: Error>(
        &self,
        read: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let before = allocated();
        let value = read()?;
        let cost = match (before, allocated()) {
            (Some(before), Some(after)) => usize::try_from(after.saturating_sub(before)),
            _ => Ok(usize::MAX),
        };
        self.charge(cost.unwrap_or(usize::MAX))?;
        Ok(value)
    }

    /// Puts an element in `list`, counting the list's first allocation (the
    /// element counts itself): the twin of [`keep`] for lists.
    pub fn push<T, E: Error>(&self, list: &mut Vec<T>, item: T) -> Result<(), E> {
        if list.is_empty() {
            self.charge(ARRAY)?;
        }
        list.push(item);
        Ok(())
    }
}

/// The bytes this thread has allocated so far, by jemalloc's own count (berth's
/// allocator); `None` where it does not count.
fn allocated() -> Option<u64> {
    thread_local! {
        // Found once per thread: looking the counter up by name costs more than
        // reading it.
        static ALLOCATED: Option<tikv_jemalloc_ctl::thread::ThreadLocal<u64>> =
            tikv_jemalloc_ctl::thread::allocatedp::read().ok();
    }
    ALLOCATED.with(|counter| counter.map(|c| c.get()))
}

/// Any JSON value, read as `serde_json::Value` reads it, counted on the meter.
#[derive(Clone, Copy)]
pub struct MeteredValue<'m>(pub &'m Meter);

impl<'de> DeserializeSeed<'de> for MeteredValue<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MeteredValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: Error>(self, value: bool) -> Result<Value, E> {
        self.0.charge(ITEM)?;
        Ok(Value::Bool(value))
    }

    fn visit_i64<E: Error>(self, value: i64) -> Result<Value, E> {
        self.0.charge(ITEM)?;
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E: Error>(self, value: u64) -> Result<Value, E> {
        self.0.charge(ITEM)?;
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E: Error>(self, value: f64) -> Result<Value, E> {
        self.0.charge(ITEM)?;
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: Error>(self, value: &str) -> Result<Value, E> {
        self.0.charge_text(value.len())?;
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E: Error>(self, value: String) -> Result<Value, E> {
        self.0.charge_text(value.len())?;
        Ok(Value::String(value))
    }

    fn visit_none<E: Error>(self) -> Result<Value, E> {
        self.0.charge(ITEM)?;
        Ok(Value::Null)
    }

    fn visit_unit<E: Error>(self) -> Result<Value, E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        self.0.charge(ITEM)?;
        let mut items = Vec::new();
        while let Some(item) = access.next_element_seed(self)? {
            self.0.push(&mut items, item)?;
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        self.0.charge(ITEM)?;
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = access.next_value_seed(self)?;
            keep(self.0, &mut map, key, value)?;
        }
        Ok(Value::Object(map))
    }
}

/// A member's key, borrowed from the input when it holds no escapes: the key of a
/// member that is skipped costs no allocation.
pub struct Key<'de>(pub Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: Error>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Borrowed(key)))
    }

    fn visit_str<E: Error>(self, key: &str) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(key.to_owned())))
    }

    fn visit_string<E: Error>(self, key: String) -> Result<Key<'de>, E> {
        Ok(Key(Cow::Owned(key)))
    }
}

/// Puts a member in `map`, counting its key (and the map's first node).
fn keep<E: Error>(
    meter: &Meter,
    map: &mut Map<String, Value>,
    key: String,
    value: Value,
) -> Result<(), E> {
    let first = if map.is_empty() { OBJECT } else { 0 };
    meter.charge(first.saturating_add(text(key.len())))?;
    map.insert(key, value);
    Ok(())
}

/// What [`read_json`] skips besides `metadata.managedFields`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Nothing else.
    Nothing,
    /// `status` too: admission decides on the spec.
    Status,
    /// `status`, in a Pod's `spec` all but the containers and the fields of
    /// [`POD_SPEC_READ`], and in its containers (init and ephemeral ones too) all
    /// but `name`, `image`, `resources` and `restartPolicy`. Admission reads
    /// nothing else there and patches nothing there, and env, probes, mounts and
    /// volumes are most of a pod's bytes: building them into JSON values was most
    /// of a review's cost.
    PodContainerDetail,
}

/// The `spec` keys whose lists hold containers.
const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
/// The other keys of a Pod's `spec` that [`Skip::PodContainerDetail`] keeps: what
/// admission reads ([`crate::placement::pod::PodObject`]) and what its patch compares
/// before it writes ([`crate::placement::patch`]). The rest (volumes, DNS, security
/// context, ...) is neither read nor patched.
const POD_SPEC_READ: [&str; 11] = [
    "affinity",
    "nodeName",
    "nodeSelector",
    "preemptionPolicy",
    "priority",
    "priorityClassName",
    "resources",
    "schedulerName",
    "schedulingGates",
    "schedulingGroup",
    "tolerations",
];
/// What [`Skip::PodContainerDetail`] keeps of a container: the restart policy
/// tells a sidecar from an init container that runs alone, for the pod's QoS class.
const CONTAINER_ESSENTIALS: [&str; 4] = ["name", "image", "resources", "restartPolicy"];

/// Where an object stands in what is read leniently, as far as skipping goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The object itself.
    Top,
    /// Its `metadata`.
    Metadata,
    /// A Pod's `spec`, under [`Skip::PodContainerDetail`].
    PodSpec,
    /// One of that spec's containers.
    Container,
}

/// What the lenient read does with a member of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    /// Skipped unparsed.
    Skipped,
    /// An object read at this level (it must be one).
    Object(Level),
    /// A list of containers (or `null`), each read at [`Level::Container`].
    Containers,
    /// Read whole.
    Read,
}

/// What the lenient read does with the member `key` of an object at `level`: the
/// one statement of what is skipped, asked by the reader and by the cost walk
/// ([`crate::admission::cost`]), so that the walk's estimate follows the read.
pub fn member(level: Level, key: &[u8], skip: Skip) -> Member {
    let among = |keys: &[&str]| keys.iter().any(|k| k.as_bytes() == key);
    match level {
        Level::Top => match key {
            b"status" if skip != Skip::Nothing => Member::Skipped,
            b"metadata" => Member::Object(Level::Metadata),
            b"spec" if skip == Skip::PodContainerDetail => Member::Object(Level::PodSpec),
            _ => Member::Read,
        },
        Level::Metadata if key == b"managedFields" => Member::Skipped,
        Level::Metadata => Member::Read,
        Level::PodSpec if among(&CONTAINER_LISTS) => Member::Containers,
        Level::PodSpec if among(&POD_SPEC_READ) => Member::Read,
        Level::Container if among(&CONTAINER_ESSENTIALS) => Member::Read,
        Level::PodSpec | Level::Container => Member::Skipped,
    }
}

/// An object as JSON, with `metadata.managedFields` (and per `skip`, `status` and
/// most of a pod's spec) skipped unparsed: serde_json skips a value without
/// recursion, so no depth there can fail the read. `null` is no object.
pub fn read_json(text: &str, skip: Skip) -> serde_json::Result<Option<Value>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let object = LenientObject(skip, &Meter::unlimited()).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(object)
}

/// [`read_json`] as a seed, for an object read where it stands in a larger
/// document (a review's `request.object`), counted on the meter.
#[derive(Clone, Copy)]
pub struct LenientObject<'m>(pub Skip, pub &'m Meter);

impl<'de> DeserializeSeed<'de> for LenientObject<'_> {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        OptionSeed(TopObject(self)).deserialize(deserializer)
    }
}

/// The object of a [`LenientObject`] that is not `null`.
struct TopObject<'m>(LenientObject<'m>);

impl<'de> DeserializeSeed<'de> for TopObject<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        let LenientObject(skip, meter) = self.0;
        meter.charge::<D::Error>(ITEM)?;
        let seed = LenientMap {
            level: Level::Top,
            skip,
            meter,
        };
        seed.deserialize(deserializer).map(Value::Object)
    }
}

/// `null` or what `T` reads, as an `Option` field reads.
pub struct OptionSeed<T>(pub T);

impl<'de, T: DeserializeSeed<'de>> DeserializeSeed<'de> for OptionSeed<T> {
    type Value = Option<T::Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, T: DeserializeSeed<'de>> Visitor<'de> for OptionSeed<T> {
    type Value = Option<T::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an optional value")
    }

    fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(deserializer).map(Some)
    }
}

/// Reads an object at `level`, skipping what [`member`] says is skipped.
#[derive(Clone, Copy)]
struct LenientMap<'m> {
    level: Level,
    skip: Skip,
    meter: &'m Meter,
}

impl<'de> DeserializeSeed<'de> for LenientMap<'_> {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LenientMap<'_> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self.level {
            Level::Top | Level::Metadata => "a JSON object",
            Level::PodSpec => "a pod spec",
            Level::Container => "a container",
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
        let meter = self.meter;
        let mut map = Map::new();
        while let Some(Key(key)) = access.next_key()? {
            let value = match member(self.level, key.as_bytes(), self.skip) {
                Member::Skipped => {
                    access.next_value::<IgnoredAny>()?;
                    continue;
                }
                Member::Object(level) => {
                    meter.charge(ITEM)?;
                    Value::Object(access.next_value_seed(LenientMap { level, ..self })?)
                }
                Member::Containers => access.next_value_seed(LeanContainers(meter))?,
                Member::Read => access.next_value_seed(MeteredValue(meter))?,
            };
            keep(meter, &mut map, key.into_owned(), value)?;
        }
        Ok(map)
    }
}

/// A list of containers read for [`Skip::PodContainerDetail`]; `null` stays `null`.
struct LeanContainers<'m>(&'m Meter);

impl<'de> DeserializeSeed<'de> for LeanContainers<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.0.charge::<D::Error>(ITEM)?;
        let list = OptionSeed(ContainerList(self.0)).deserialize(deserializer)?;
        Ok(list.map_or(Value::Null, Value::Array))
    }
}

/// The containers of a [`LeanContainers`] that is not `null`.
struct ContainerList<'m>(&'m Meter);

impl<'de> DeserializeSeed<'de> for ContainerList<'_> {
    type Value = Vec<Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Value>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ContainerList<'_> {
    type Value = Vec<Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of containers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Vec<Value>, A::Error> {
        let mut list = Vec::new();
        let container = LenientMap {
            level: Level::Container,
            skip: Skip::PodContainerDetail,
            meter: self.0,
        };
        while let Some(container) = access.next_element_seed(container)? {
            self.0.charge(ITEM)?;
            self.0.push(&mut list, Value::Object(container))?;
        }
        Ok(list)
    }
}
