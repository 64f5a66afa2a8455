//! What the operator may do on the Kubernetes API, as one table, and the manifests made
//! from it (`deploy/operator.yaml`: a Namespace, a ServiceAccount, the ClusterRole, its
//! binding, a StatefulSet of two replicas with a snapshot volume each, and their
//! PodDisruptionBudget).
//!
//! The table names exactly the verbs the code uses, no wildcards. Two checks keep it
//! honest: the end-to-end tests run the operator under a ServiceAccount bound to this
//! ClusterRole (a missing verb is a 403 and a stuck rollout), and they read the requests
//! it made from `/metrics` ([`crate::requests`]) and fail on any the table does not name.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
    ServiceAccount, Toleration, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::requests::Request;

/// One rule of the ClusterRole, with the calls that need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// Resources, subresources as `pods/eviction`.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What in the code needs it.
    pub why: &'static str,
}

/// The operator's permissions.
pub const RULES: &[Rule] = &[
    Rule {
        group: "ichor.dev",
        resources: &["talosoperations"],
        verbs: &["get", "list", "watch", "patch"],
        why: "the controller's watch; an operation's existence is read fresh when it may hold a Lease; the finalizer",
    },
    Rule {
        group: "ichor.dev",
        resources: &["talosoperations/status", "talosmachines/status", "talosclusters/status"],
        verbs: &["patch"],
        why: "status and conditions, by server-side apply",
    },
    Rule {
        group: "ichor.dev",
        resources: &["talosmachines"],
        // An apply that makes the object is authorised as a create as well.
        verbs: &["create", "patch"],
        why: "discovery: a TalosMachine made from its Node, by server-side apply (spec.discovery: Nodes)",
    },
    Rule {
        group: "ichor.dev",
        resources: &["talosmachines", "talosclusters", "talosstorages"],
        verbs: &["list", "watch"],
        why: "the reflector stores; the storage backend lists TalosStorages",
    },
    Rule {
        group: "",
        resources: &["nodes"],
        verbs: &["list", "watch", "patch", "delete"],
        why: "the Node store; cordon before a removal; deleting a removed machine's Node",
    },
    Rule {
        group: "",
        resources: &["pods"],
        verbs: &["list"],
        why: "the pods on a node being drained for removal; the preflight gate's pods",
    },
    Rule {
        group: "apps",
        resources: &["deployments", "statefulsets", "replicasets"],
        verbs: &["list"],
        why: "the preflight gate: workloads with one replica, or all their Ready pods on one node",
    },
    Rule {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: &["list"],
        why: "the preflight gate: budgets at zero over a node's pods",
    },
    Rule {
        group: "",
        resources: &["pods/eviction"],
        verbs: &["create"],
        why: "evictions, which PodDisruptionBudgets can refuse",
    },
    Rule { group: "", resources: &["secrets"], verbs: &["get"], why: "a cluster's talosconfig" },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "create", "update", "patch"],
        why: "the cluster lock (update under resourceVersion) and leader election (patch)",
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        why: "Events and their series",
    },
    Rule {
        group: "longhorn.io",
        resources: &["nodes"],
        verbs: &["get", "list", "watch", "patch"],
        why: "Longhorn's scheduling and eviction switches (read before an eviction, to put them back), watched",
    },
    Rule {
        group: "longhorn.io",
        resources: &["replicas", "shards"],
        verbs: &["list", "watch"],
        why: "replicas and shards (Longhorn 1.12.1) left on a node",
    },
    Rule {
        group: "longhorn.io",
        resources: &["backingimages"],
        verbs: &["list"],
        why: "backing images with a file on a node a removal wipes",
    },
];

/// Whether [`RULES`] allow `request`.
#[must_use]
pub fn allows(request: &Request) -> bool {
    let resource = if request.subresource.is_empty() {
        request.resource.clone()
    } else {
        format!("{}/{}", request.resource, request.subresource)
    };
    RULES.iter().any(|rule| {
        rule.group == request.group
            && rule.resources.contains(&resource.as_str())
            && rule.verbs.contains(&request.verb.as_str())
    })
}

/// The names the manifests use.
pub const NAME: &str = "ichor-operator";
/// The namespace the operator runs in.
pub const NAMESPACE: &str = "ichor-system";
/// The image the Deployment runs (built from `deploy/Dockerfile`).
pub const IMAGE: &str = "localhost/ichor-operator:0.1.0";
/// The port of `/metrics`, `/healthz` and `/readyz` in the Deployment.
pub const HTTP_PORT: i32 = 8080;

/// The ClusterRole named `name` with [`RULES`].
#[must_use]
pub fn cluster_role(name: &str) -> ClusterRole {
    let rules = RULES
        .iter()
        .map(|rule| PolicyRule {
            api_groups: Some(vec![rule.group.to_owned()]),
            resources: Some(rule.resources.iter().map(|r| (*r).to_owned()).collect()),
            verbs: rule.verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..PolicyRule::default()
        })
        .collect();
    ClusterRole {
        metadata: ObjectMeta { name: Some(name.to_owned()), labels: Some(labels()), ..ObjectMeta::default() },
        rules: Some(rules),
        ..ClusterRole::default()
    }
}

/// A ClusterRoleBinding of the ClusterRole `role` to the ServiceAccount `namespace/account`.
#[must_use]
pub fn cluster_role_binding(name: &str, role: &str, namespace: &str, account: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(name.to_owned()), labels: Some(labels()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: role.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: account.to_owned(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    }
}

fn labels() -> BTreeMap<String, String> {
    [("app.kubernetes.io/name".to_owned(), NAME.to_owned())].into()
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels()),
        ..ObjectMeta::default()
    }
}

/// Where the operator keeps etcd snapshots in its pod: a volume of its own per replica.
pub const SNAPSHOT_DIR: &str = "/var/lib/ichor/snapshots";
/// The volume claim template of the snapshot volume.
pub const SNAPSHOT_VOLUME: &str = "etcd-snapshots";
/// The user the image runs as (distroless `nonroot`); the snapshot volume is its group's.
const NONROOT: i64 = 65_532;

/// The operator's StatefulSet: two replicas on different nodes (one leads, the other takes
/// over), each with its own snapshot volume (a ReadWriteOnce claim any default
/// StorageClass can serve: the leader writes the etcd snapshot into its own), allowed on
/// control-plane nodes, no privilege.
fn stateful_set() -> StatefulSet {
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("http".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(10),
        ..Probe::default()
    };
    let quantity = |q: &str| Quantity(q.to_owned());
    let field = |name: &str, path: &str| EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.to_owned(), ..ObjectFieldSelector::default() }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let container = Container {
        name: "operator".to_owned(),
        image: Some(IMAGE.to_owned()),
        args: Some(
            ["--log-format", "json", "--listen", &format!("0.0.0.0:{HTTP_PORT}"), "--etcd-snapshot-dir", SNAPSHOT_DIR]
                .map(str::to_owned)
                .to_vec(),
        ),
        env: Some(vec![
            field("POD_NAMESPACE", "metadata.namespace"),
            field("POD_NAME", "metadata.name"),
            // Its machine goes last in its role (OperatorConfig::own_node).
            field("NODE_NAME", "spec.nodeName"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("http".to_owned()),
            container_port: HTTP_PORT,
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/readyz")),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".to_owned(), quantity("50m")), ("memory".to_owned(), quantity("64Mi"))].into()),
            limits: Some([("memory".to_owned(), quantity("512Mi"))].into()),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".to_owned()]), ..Capabilities::default() }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: SNAPSHOT_VOLUME.to_owned(),
            mount_path: SNAPSHOT_DIR.to_owned(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(SNAPSHOT_VOLUME.to_owned()),
            labels: Some(labels()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_owned(), quantity("10Gi"))].into()),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    let toleration = |key: &str| Toleration {
        key: Some(key.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        ..Toleration::default()
    };
    StatefulSet {
        metadata: meta(NAME, Some(NAMESPACE)),
        spec: StatefulSetSpec {
            replicas: Some(2),
            service_name: Some(NAME.to_owned()),
            // Both start at once; an update replaces one replica at a time (the other keeps
            // or takes the leadership).
            pod_management_policy: Some("Parallel".to_owned()),
            selector: LabelSelector { match_labels: Some(labels()), ..LabelSelector::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    // For a Prometheus that discovers pods by annotation (no ServiceMonitor
                    // needed); deploy/monitoring/ has the scrape job and a Grafana dashboard.
                    annotations: Some(
                        [
                            ("prometheus.io/scrape".to_owned(), "true".to_owned()),
                            ("prometheus.io/port".to_owned(), HTTP_PORT.to_string()),
                            ("prometheus.io/path".to_owned(), "/metrics".to_owned()),
                        ]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NAME.to_owned()),
                    // Long enough for the reconciles in flight to end and the leadership
                    // to be handed over (graceful shutdown on SIGTERM).
                    termination_grace_period_seconds: Some(60),
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(NONROOT),
                        run_as_group: Some(NONROOT),
                        fs_group: Some(NONROOT),
                        run_as_non_root: Some(true),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_owned(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                                label_selector: Some(LabelSelector {
                                    match_labels: Some(labels()),
                                    ..LabelSelector::default()
                                }),
                                topology_key: "kubernetes.io/hostname".to_owned(),
                                ..PodAffinityTerm::default()
                            }]),
                            ..PodAntiAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    tolerations: Some(vec![toleration("node-role.kubernetes.io/control-plane")]),
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            volume_claim_templates: Some(vec![claim]),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    }
}

/// At least one replica stays up through a drain (the engine's own included).
fn disruption_budget() -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(NAME, Some(NAMESPACE)),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector { match_labels: Some(labels()), ..LabelSelector::default() }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// `deploy/operator.yaml`.
///
/// # Panics
/// Never in practice: the objects are plain data that always serialize.
#[must_use]
pub fn operator_yaml() -> String {
    fn yaml<T: serde::Serialize + k8s_openapi::Resource>(object: &T) -> String {
        let mut value = serde_json::to_value(object).expect("an object serializes");
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".to_owned(), T::API_VERSION.into());
            map.insert("kind".to_owned(), T::KIND.into());
        }
        serde_saphyr::to_string(&value).expect("an object serializes to YAML")
    }
    let docs = [
        yaml(&Namespace { metadata: meta(NAMESPACE, None), ..Namespace::default() }),
        yaml(&ServiceAccount { metadata: meta(NAME, Some(NAMESPACE)), ..ServiceAccount::default() }),
        yaml(&cluster_role(NAME)),
        yaml(&cluster_role_binding(NAME, NAME, NAMESPACE, NAME)),
        yaml(&stateful_set()),
        yaml(&disruption_budget()),
    ];
    format!(
        "# Generated from crates/ichor-operator/src/rbac.rs; do not edit.\n# Regenerate: ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test suite manifests\n---\n{}",
        docs.join("---\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(verb: &str, group: &str, resource: &str, subresource: &str) -> Request {
        Request {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
        }
    }

    #[test]
    fn the_rules_allow_what_they_name_and_nothing_near_it() {
        assert!(allows(&request("create", "", "pods", "eviction")));
        assert!(!allows(&request("create", "", "pods", "")), "creating pods is not evicting them");
        assert!(allows(&request("patch", "ichor.dev", "talosoperations", "status")));
        assert!(!allows(&request("update", "ichor.dev", "talosoperations", "status")));
        assert!(!allows(&request("delete", "ichor.dev", "talosoperations", "")));
        assert!(!allows(&request("list", "", "secrets", "")), "one named Secret at a time");
        assert!(!allows(&request("patch", "", "nodes", "status")), "the operator never writes a Node's status");
        assert!(allows(&request("patch", "longhorn.io", "nodes", "")));
        assert!(!allows(&request("delete", "longhorn.io", "nodes", "")), "a group's nodes are not another's");
    }

    #[test]
    fn no_rule_has_a_wildcard() {
        for rule in RULES {
            assert!(!rule.group.contains('*'));
            assert!(rule.resources.iter().chain(rule.verbs).all(|s| !s.contains('*')), "{rule:?}");
            assert!(!rule.why.is_empty());
        }
    }
}
