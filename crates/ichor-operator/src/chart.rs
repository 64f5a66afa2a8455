//! The operator's Helm chart (`deploy/chart/`), generated from the same tables as
//! `deploy/operator.yaml` ([`crate::rbac`]) and `deploy/crds.yaml`
//! ([`ichor_adapters::kubernetes::manifests`]): never a second copy kept by hand.
//!
//! The objects are built by the functions that build the kustomize base; only the values a
//! person sets become Helm's template expressions: the image, the replicas, the snapshot
//! store (a volume per replica, or an S3 bucket whose credentials come from a Secret), the
//! resources, the node selection, and the Kubernetes-upgrade grants on or off. With the
//! default values the chart renders exactly the objects of the kustomize base (less its
//! Namespace: Helm installs into the release's); a test renders it with the real helm and
//! compares them object by object.
//!
//! A value that would make a broken install (a store that is neither `volume` nor `s3`, an
//! S3 store with no bucket or Secret, a misspelt key) is refused by `values.schema.json`
//! before anything is rendered.
//!
//! This module writes no file: `ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test
//! suite manifests` writes [`files`] into `deploy/chart/`, and the same test checks that the
//! committed files are these.

use serde_json::{Value, json};

use crate::rbac;

/// The chart's name: the release's objects keep the names the RBAC table gives them
/// ([`rbac::NAME`] and the roles'), so that a cluster's grant (`rbac::grant_command`) reads
/// the same whichever way the operator was installed.
pub const CHART: &str = "ichor-operator";

/// Where Helm puts the release: its namespace is the operator's.
const RELEASE_NAMESPACE: &str = "{{ .Release.Namespace }}";

/// The first lines of every generated file, as `comment` writes comments.
fn header(comment: &str) -> String {
    format!(
        "{comment} Generated from crates/ichor-operator/src/chart.rs; do not edit.\n\
         {comment} Regenerate: ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test suite manifests\n"
    )
}

/// Every file of the chart: its path under `deploy/chart/` and its text.
///
/// # Panics
/// Never in practice: the objects are plain data that always serialize.
#[must_use]
pub fn files() -> Vec<(&'static str, String)> {
    vec![
        ("Chart.yaml", chart_yaml()),
        ("values.yaml", values_yaml()),
        ("values.schema.json", serde_json::to_string_pretty(&values_schema()).expect("JSON") + "\n"),
        ("crds/crds.yaml", ichor_adapters::kubernetes::manifests::crds_yaml()),
        ("templates/rbac.yaml", rbac_yaml()),
        ("templates/kubernetes-upgrades.yaml", kubernetes_upgrades_yaml()),
        ("templates/statefulset.yaml", stateful_set_yaml()),
        ("templates/poddisruptionbudget.yaml", disruption_budget_yaml()),
        ("templates/NOTES.txt", notes()),
    ]
}

fn chart_yaml() -> String {
    let version = env!("CARGO_PKG_VERSION");
    let chart = json!({
        "apiVersion": "v2",
        "name": CHART,
        "description": "Ichor: rolls Talos Linux clusters to a new Talos or Kubernetes version, one \
                        control plane at a time, with etcd's quorum checked before each.",
        "type": "application",
        "version": version,
        "appVersion": version,
        "keywords": ["talos", "upgrade", "operator"],
    });
    header("#") + &serde_saphyr::to_string(&chart).expect("YAML")
}

/// The repository and the tag of [`rbac::IMAGE`].
fn image() -> (&'static str, &'static str) {
    rbac::IMAGE.rsplit_once(':').expect("the image has a tag")
}

/// The default values, each with what it sets: what the kustomize base ships.
fn values() -> Vec<(&'static str, &'static str, Value)> {
    let set = rbac::typed(&rbac::stateful_set());
    let pod = &set["spec"]["template"]["spec"];
    let claim = &set["spec"]["volumeClaimTemplates"][0]["spec"];
    let (repository, tag) = image();
    vec![
        (
            "image",
            "The operator's image (deploy/Dockerfile or scripts/image.sh builds it).",
            json!({ "repository": repository, "tag": tag, "pullPolicy": rbac::IMAGE_PULL_POLICY }),
        ),
        (
            "replicas",
            "Replicas of the StatefulSet: one leads, the others wait to take over. Two, on \
             different nodes, survive a drain of either.",
            set["spec"]["replicas"].clone(),
        ),
        (
            "etcdSnapshots",
            "Where the etcd snapshot taken before each control plane's upgrade is kept. \
             `volume`: a PersistentVolumeClaim per replica (storageClassName empty: the \
             default StorageClass). `s3`: an S3-compatible bucket, signed with the keys \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY of the Secret secretName in the \
             release's namespace; endpoint empty: AWS, from the region.",
            json!({
                "store": "volume",
                "volume": { "size": claim["resources"]["requests"]["storage"], "storageClassName": "" },
                "s3": { "bucket": "", "prefix": "", "region": "us-east-1", "endpoint": "", "secretName": "" },
            }),
        ),
        ("resources", "The operator container's requests and limits.", pod["containers"][0]["resources"].clone()),
        ("nodeSelector", "Where the replicas may run.", json!({})),
        (
            "tolerations",
            "The replicas may run on control planes (their machines go last in their role).",
            pod["tolerations"].clone(),
        ),
        ("affinity", "The replicas run on different nodes.", pod["affinity"].clone()),
        (
            "kubernetesUpgrades",
            "The reads a Kubernetes upgrade needs (a ClusterRole of their own, as the kustomize \
             component deploy/components/kubernetes-upgrades/): false for Talos upgrades only.",
            json!({ "enabled": true }),
        ),
    ]
}

fn values_yaml() -> String {
    let mut text = header("#");
    for (key, doc, value) in values() {
        text.push('\n');
        for line in textwrap(doc, 88) {
            text.push_str(&format!("# {line}\n"));
        }
        text.push_str(&serde_saphyr::to_string(&json!({ key: value })).expect("YAML"));
    }
    text
}

/// `text` in lines of at most `width` characters, broken at spaces.
fn textwrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("one line");
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(word.to_owned());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

/// What the values may be: helm refuses others before it renders anything.
fn values_schema() -> Value {
    let string = json!({ "type": "string" });
    let object = json!({ "type": "object" });
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "ichor-operator values",
        "type": "object",
        "additionalProperties": false,
        "required": ["image", "replicas", "etcdSnapshots", "kubernetesUpgrades"],
        "properties": {
            "image": {
                "type": "object",
                "additionalProperties": false,
                "required": ["repository", "tag"],
                "properties": {
                    "repository": { "type": "string", "minLength": 1 },
                    "tag": { "type": "string", "minLength": 1 },
                    "pullPolicy": { "enum": ["Always", "IfNotPresent", "Never"] },
                },
            },
            "replicas": { "type": "integer", "minimum": 0 },
            "etcdSnapshots": {
                "type": "object",
                "additionalProperties": false,
                "required": ["store"],
                "properties": {
                    "store": { "enum": ["volume", "s3"] },
                    "volume": {
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "size": { "type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$" },
                            "storageClassName": string,
                        },
                    },
                    "s3": {
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "bucket": string,
                            "prefix": string,
                            "region": string,
                            "endpoint": { "type": "string", "pattern": "^(https?://.+)?$" },
                            "secretName": string,
                        },
                    },
                },
                "if": { "properties": { "store": { "const": "s3" } } },
                "then": {
                    "required": ["s3"],
                    "properties": {
                        "s3": {
                            "required": ["bucket", "secretName"],
                            "properties": {
                                "bucket": { "type": "string", "minLength": 1 },
                                "secretName": { "type": "string", "minLength": 1 },
                            },
                        },
                    },
                },
            },
            "resources": object,
            "nodeSelector": { "type": "object", "additionalProperties": string },
            "tolerations": { "type": "array", "items": object },
            "affinity": object,
            "kubernetesUpgrades": {
                "type": "object",
                "additionalProperties": false,
                "required": ["enabled"],
                "properties": { "enabled": { "type": "boolean" } },
            },
        },
    })
}

/// `objects` as the YAML documents of a template, with [`Marker`]s made Helm's.
fn template(objects: &[Value]) -> String {
    let docs: Vec<String> =
        objects.iter().map(|o| expand(&serde_saphyr::to_string(o).expect("an object serializes to YAML"))).collect();
    docs.join("---\n")
}

/// The ServiceAccount, the roles and their bindings, as the kustomize base has them, in
/// the release's namespace.
fn rbac_yaml() -> String {
    let account = k8s_openapi::api::core::v1::ServiceAccount {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(rbac::NAME.to_owned()),
            namespace: Some(RELEASE_NAMESPACE.to_owned()),
            labels: rbac::cluster_role(rbac::NAME).metadata.labels,
            ..Default::default()
        },
        ..Default::default()
    };
    let objects = [
        rbac::typed(&account),
        rbac::typed(&rbac::cluster_role(rbac::NAME)),
        rbac::typed(&rbac::cluster_role_binding(rbac::NAME, rbac::NAME, RELEASE_NAMESPACE, rbac::NAME)),
        rbac::typed(&rbac::cluster_namespace_role()),
        rbac::typed(&rbac::leader_role(RELEASE_NAMESPACE)),
        rbac::typed(&rbac::leader_role_binding(RELEASE_NAMESPACE, rbac::NAME)),
    ];
    header("#") + "---\n" + &template(&objects)
}

fn kubernetes_upgrades_yaml() -> String {
    let objects = [
        rbac::typed(&rbac::kubernetes_upgrades_role()),
        rbac::typed(&rbac::cluster_role_binding(
            rbac::KUBERNETES_ROLE,
            rbac::KUBERNETES_ROLE,
            RELEASE_NAMESPACE,
            rbac::NAME,
        )),
    ];
    format!(
        "{}{{{{- if .Values.kubernetesUpgrades.enabled }}}}\n---\n{}{{{{- end }}}}\n",
        header("#"),
        template(&objects)
    )
}

/// A place in an object where a value becomes a template expression that is not a string
/// (a number, a block of YAML, lines present or not): the object carries `@@name@@` there,
/// and [`expand`] rewrites its line.
#[derive(Debug, Clone, Copy)]
enum Marker {
    /// The value's YAML, an integer.
    Number(&'static str),
    /// The value's YAML, a block under the key.
    Block(&'static str),
    /// The value's YAML, a block under the key, or no key when the value is empty.
    OptionalBlock(&'static str),
    /// The key and the value's quoted text, or no line when the value is empty.
    Optional(&'static str),
    /// Two items of a list, a flag and the value, or none when the value is empty.
    OptionalFlag(&'static str, &'static str),
}

const MARKERS: &[(&str, Marker)] = &[
    ("replicas", Marker::Number("replicas")),
    ("resources", Marker::Block("resources")),
    ("nodeSelector", Marker::OptionalBlock("nodeSelector")),
    ("tolerations", Marker::Block("tolerations")),
    ("affinity", Marker::Block("affinity")),
    ("storageClassName", Marker::Optional("etcdSnapshots.volume.storageClassName")),
    ("endpoint", Marker::OptionalFlag("--etcd-snapshot-s3-endpoint", "etcdSnapshots.s3.endpoint")),
];

fn marker(name: &str) -> Value {
    debug_assert!(MARKERS.iter().any(|(n, _)| *n == name), "{name} is a marker");
    Value::String(format!("@@{name}@@"))
}

/// `yaml` with each line that carries a marker rewritten as its template.
fn expand(yaml: &str) -> String {
    let mut out = String::new();
    for line in yaml.lines() {
        let Some((name, marker)) = MARKERS.iter().find(|(name, _)| line.contains(&format!("@@{name}@@"))) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let at = line.find(&format!("@@{name}@@")).expect("found") - 1; // the opening quote
        let lead = &line[..at];
        let indent = line.len() - line.trim_start().len();
        let pad = " ".repeat(indent);
        let text = match *marker {
            Marker::Number(path) => format!("{lead}{{{{ .Values.{path} }}}}\n"),
            Marker::Block(path) => {
                format!("{}\n{{{{- toYaml .Values.{path} | nindent {} }}}}\n", lead.trim_end(), indent + 2)
            }
            Marker::OptionalBlock(path) => format!(
                "{{{{- with .Values.{path} }}}}\n{}\n{{{{- toYaml . | nindent {} }}}}\n{{{{- end }}}}\n",
                lead.trim_end(),
                indent + 2
            ),
            Marker::Optional(path) => {
                format!("{{{{- with .Values.{path} }}}}\n{}{{{{ . | quote }}}}\n{{{{- end }}}}\n", lead)
            }
            Marker::OptionalFlag(flag, path) => {
                format!("{{{{- with .Values.{path} }}}}\n{pad}- {flag}\n{pad}- {{{{ . | quote }}}}\n{{{{- end }}}}\n")
            }
        };
        out.push_str(&text);
    }
    out
}

/// The StatefulSet of the kustomize base with the values' expressions in it, for the
/// snapshot store `store` (`"volume"` or `"s3"`).
fn stateful_set(store: &str) -> Value {
    let mut set = rbac::typed(&rbac::stateful_set());
    set["metadata"]["namespace"] = RELEASE_NAMESPACE.into();
    set["spec"]["replicas"] = marker("replicas");
    let pod = &mut set["spec"]["template"]["spec"];
    pod["nodeSelector"] = marker("nodeSelector");
    pod["tolerations"] = marker("tolerations");
    pod["affinity"] = marker("affinity");
    let container = &mut pod["containers"][0];
    container["image"] = "{{ .Values.image.repository }}:{{ .Values.image.tag }}".into();
    container["imagePullPolicy"] = "{{ .Values.image.pullPolicy }}".into();
    container["resources"] = marker("resources");
    let args = container["args"].as_array_mut().expect("args");
    let dir = args.iter().position(|a| a == "--etcd-snapshot-dir").expect("the snapshot directory's flag");
    match store {
        "volume" => {
            let claim = &mut set["spec"]["volumeClaimTemplates"][0]["spec"];
            claim["resources"]["requests"]["storage"] = "{{ .Values.etcdSnapshots.volume.size }}".into();
            claim["storageClassName"] = marker("storageClassName");
        }
        _ => {
            let s3 = |key: &str| Value::String(format!("{{{{ .Values.etcdSnapshots.s3.{key} }}}}"));
            let flags = [
                ("--etcd-snapshot-s3-bucket".into(), s3("bucket")),
                ("--etcd-snapshot-s3-prefix".into(), s3("prefix")),
                ("--etcd-snapshot-s3-region".into(), s3("region")),
            ];
            args.splice(dir..dir + 2, flags.into_iter().flat_map(|(flag, value): (Value, Value)| [flag, value]));
            args.push(marker("endpoint"));
            let secret = |key: &str| {
                json!({ "name": key, "valueFrom": { "secretKeyRef": {
                    "name": "{{ .Values.etcdSnapshots.s3.secretName }}", "key": key } } })
            };
            let env = container["env"].as_array_mut().expect("env");
            env.extend([secret("AWS_ACCESS_KEY_ID"), secret("AWS_SECRET_ACCESS_KEY")]);
            let object = container.as_object_mut().expect("a container");
            object.remove("volumeMounts");
            let spec = set["spec"].as_object_mut().expect("a spec");
            spec.remove("volumeClaimTemplates");
        }
    }
    set
}

fn stateful_set_yaml() -> String {
    format!(
        "{}{{{{- if eq .Values.etcdSnapshots.store \"s3\" }}}}\n---\n{}{{{{- else }}}}\n---\n{}{{{{- end }}}}\n",
        header("#"),
        template(&[stateful_set("s3")]),
        template(&[stateful_set("volume")])
    )
}

fn disruption_budget_yaml() -> String {
    let mut budget = rbac::typed(&rbac::disruption_budget());
    budget["metadata"]["namespace"] = RELEASE_NAMESPACE.into();
    header("#") + "---\n" + &template(&[budget])
}

/// What helm prints after an install: the one grant a person makes per cluster namespace.
fn notes() -> String {
    format!(
        "The Ichor operator runs in {ns} ({{{{ .Values.replicas }}}} replicas, one leading).\n\
         \n\
         It reads TalosClusters everywhere, but reads their Secrets and takes their lock only in\n\
         the namespaces a person grants it. For each namespace that holds a TalosCluster:\n\
         \n  {grant}\n\
         \n\
         Then `kubectl ichor status` (the kubectl plugin) shows each operation's progress.\n",
        ns = RELEASE_NAMESPACE,
        grant = rbac::grant_command("NAMESPACE", RELEASE_NAMESPACE, rbac::NAME),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_line_becomes_its_template_at_its_indentation() {
        let yaml = "spec:\n  replicas: '@@replicas@@'\n  template:\n    resources: \"@@resources@@\"\n    args:\n    - a\n    - '@@endpoint@@'\n";
        let expanded = expand(yaml);
        assert_eq!(
            expanded,
            "spec:\n  replicas: {{ .Values.replicas }}\n  template:\n    resources:\n{{- toYaml .Values.resources | nindent 6 }}\n    args:\n    - a\n\
             {{- with .Values.etcdSnapshots.s3.endpoint }}\n    - --etcd-snapshot-s3-endpoint\n    - {{ . | quote }}\n{{- end }}\n"
        );
    }

    #[test]
    fn every_marker_placed_in_a_template_is_expanded() {
        for (path, text) in files() {
            assert!(!text.contains("@@"), "{path} keeps a marker:\n{text}");
        }
    }

    #[test]
    fn the_values_default_to_what_the_kustomize_base_ships() {
        let values: std::collections::BTreeMap<_, _> = values().into_iter().map(|(k, _, v)| (k, v)).collect();
        assert_eq!(values["replicas"], 2);
        assert_eq!(
            values["image"]["repository"]
                .as_str()
                .map(|r| format!("{r}:{}", values["image"]["tag"].as_str().unwrap()))
                .as_deref(),
            Some(rbac::IMAGE)
        );
        assert_eq!(values["etcdSnapshots"]["volume"]["size"], "10Gi");
        assert!(values["tolerations"].as_array().is_some_and(|t| !t.is_empty()));
    }

    #[test]
    fn long_comments_are_broken_at_spaces() {
        assert_eq!(textwrap("aa bb cc", 5), ["aa bb", "cc"]);
        assert_eq!(textwrap("one", 2), ["one"]);
    }
}
