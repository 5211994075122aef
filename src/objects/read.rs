//! How berth reads every object from the apiserver: leniently, the parts it uses.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::policy::compile::Labels;

/// `null` reads as the default.
pub fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A timestamp, or nothing when it does not parse.
pub fn lenient_time<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Time>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    Ok(text.and_then(|t| t.parse().ok()).map(Time))
}

/// The parts of `metadata` berth uses. Unknown keys, `managedFields` among them,
/// are skipped unparsed. A pod reads its annotations and owner references its own
/// way (`A`, `O`: only berth's record, and within a bound).
#[derive(Deserialize, Default)]
#[serde(
    rename_all = "camelCase",
    bound(deserialize = "A: Deserialize<'de> + Default, O: Deserialize<'de> + Default")
)]
pub struct MetaFields<A = Labels, O = Vec<OwnerReference>> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: A,
    #[serde(default, deserialize_with = "nullable")]
    pub owner_references: O,
    #[serde(default, deserialize_with = "nullable")]
    finalizers: Vec<String>,
    #[serde(default, deserialize_with = "lenient_time")]
    creation_timestamp: Option<Time>,
    #[serde(default, deserialize_with = "lenient_time")]
    deletion_timestamp: Option<Time>,
}

impl<A, O> MetaFields<A, O> {
    /// The usual `ObjectMeta` with these `annotations` and `owners`.
    pub fn into_meta(self, annotations: Labels, owners: Vec<OwnerReference>) -> ObjectMeta {
        let some = |map: Labels| (!map.is_empty()).then_some(map);
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            generation: self.generation,
            labels: some(self.labels),
            annotations: some(annotations),
            owner_references: (!owners.is_empty()).then_some(owners),
            finalizers: (!self.finalizers.is_empty()).then_some(self.finalizers),
            creation_timestamp: self.creation_timestamp,
            deletion_timestamp: self.deletion_timestamp,
            ..ObjectMeta::default()
        }
    }
}

/// `metadata`, read leniently into the usual `ObjectMeta`, without `managedFields`.
pub fn lenient_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let mut m = Option::<MetaFields>::deserialize(deserializer)?.unwrap_or_default();
    let (annotations, owners) = (
        std::mem::take(&mut m.annotations),
        std::mem::take(&mut m.owner_references),
    );
    Ok(m.into_meta(annotations, owners))
}

/// Implements `kube::Resource` for a lenient type by borrowing the kind, group,
/// version and plural of the k8s-openapi type it stands for.
macro_rules! stands_for {
    ($lenient:ty, $of:ty, metadata_api: $meta:expr, $($generics:tt)*) => {
        impl $($generics)* ::kube::Resource for $lenient {
            type DynamicType = ();
            type Scope = <$of as ::kube::Resource>::Scope;
            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                <$of as ::kube::Resource>::kind(&())
            }
            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                <$of as ::kube::Resource>::group(&())
            }
            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                <$of as ::kube::Resource>::version(&())
            }
            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                <$of as ::kube::Resource>::plural(&())
            }
            fn metadata_api() -> bool {
                $meta
            }
            fn meta(&self) -> &::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use stands_for;

/// Resource quantities by name, in order, each read as a number; one that is not
/// is left out.
pub fn readable_quantities<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Box<[(String, f64)]>, D::Error> {
    let raw = Option::<BTreeMap<String, Value>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(raw
        .into_iter()
        .filter_map(|(k, v)| Some((k, crate::quantity::from_json(&v)?)))
        .collect())
}
