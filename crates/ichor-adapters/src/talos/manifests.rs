//! Talos's bootstrap manifests on the wire: a `ManifestSpec` holds each Kubernetes object
//! as a `google.protobuf.Struct`, read here into JSON (and written from it, for the
//! server in front of the simulator).
//!
//! A `Struct` carries every number as a double: a whole number reads back as an integer
//! (`replicas: 2`, not `2.0`, which the API server refuses for an integer field), as
//! Talos's own client decodes it.

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use serde_json::{Map, Number, Value as Json};

use super::proto::resource::{ManifestSpec, SingleManifest};

/// The objects of a manifest, as JSON (an item with no object is skipped).
#[must_use]
pub fn objects(spec: &ManifestSpec) -> Vec<Json> {
    spec.items.iter().filter_map(|item| item.object.as_ref()).map(|object| Json::Object(fields(object))).collect()
}

/// A manifest of these objects (each must be a JSON object; others are skipped).
#[must_use]
pub fn manifest(objects: &[Json]) -> ManifestSpec {
    let items = objects
        .iter()
        .filter_map(|o| match to_value(o).kind {
            Some(Kind::StructValue(object)) => Some(SingleManifest { object: Some(object) }),
            _ => None,
        })
        .collect();
    ManifestSpec { items }
}

fn fields(object: &Struct) -> Map<String, Json> {
    object.fields.iter().map(|(k, v)| (k.clone(), to_json(v))).collect()
}

fn to_json(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::NumberValue(n)) => number(*n),
        Some(Kind::StructValue(s)) => Json::Object(fields(s)),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(to_json).collect()),
    }
}

/// A double as JSON: a whole number within 2^53 as an integer.
fn number(n: f64) -> Json {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if n.fract() == 0.0 && n.abs() <= EXACT {
        #[allow(clippy::cast_possible_truncation)]
        return Json::Number(Number::from(n as i64));
    }
    Number::from_f64(n).map_or(Json::Null, Json::Number)
}

fn to_value(json: &Json) -> Value {
    let kind = match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::Array(a) => Kind::ListValue(ListValue { values: a.iter().map(to_value).collect() }),
        Json::Object(o) => {
            Kind::StructValue(Struct { fields: o.iter().map(|(k, v)| (k.clone(), to_value(v))).collect() })
        }
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn an_object_goes_over_the_wire_and_back_with_whole_numbers_as_integers() {
        let daemonset = serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"k8s-app": "kube-proxy"}},
            "spec": {
                "revisionHistoryLimit": 10,
                "template": {"spec": {
                    "hostNetwork": true,
                    "priorityClassName": null,
                    "containers": [{"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.35.0"}]
                }},
                "ratio": 0.5
            }
        });
        let wire = manifest(std::slice::from_ref(&daemonset)).encode_to_vec();
        let back = objects(&ManifestSpec::decode(wire.as_slice()).unwrap());
        assert_eq!(back, vec![daemonset]);
        assert_eq!(serde_json::to_string(&back[0]["spec"]["revisionHistoryLimit"]).unwrap(), "10");
    }
}
