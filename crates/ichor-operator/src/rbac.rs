//! What the operator may do on the Kubernetes API, as one table, and the manifests made
//! from it (`deploy/operator.yaml`: a Namespace, a ServiceAccount, the roles and their
//! bindings, a StatefulSet of two replicas with a snapshot volume each, and their
//! PodDisruptionBudget).
//!
//! The table names exactly the verbs the code uses, no wildcards, and where each is
//! granted ([`Scope`]): Secrets and the cluster lock's Leases only in the namespaces that
//! hold TalosClusters (a RoleBinding there, made with the cluster: [`cluster_namespace_binding`]),
//! the leader Lease only in the operator's own namespace and by name; never a cluster-wide
//! grant of either (which would reach kube-system's leader Leases and every Secret).
//!
//! The reads only a Kubernetes upgrade needs are a ClusterRole of their own
//! ([`Scope::KubernetesUpgrades`], `deploy/components/kubernetes-upgrades/`): a team that
//! runs only Talos upgrades installs without them. No rule writes workloads, CRDs or RBAC:
//! a Kubernetes upgrade's manifests are applied under the cluster's admin kubeconfig
//! (decision 0014 rule 19).
//!
//! Two checks keep it honest: the end-to-end tests run the operator under a ServiceAccount
//! bound exactly as `deploy/` binds it (a missing grant is a 403 and a stuck rollout), and
//! they read the requests it made, by namespace, from `/metrics` ([`crate::requests`]) and
//! fail on any the table does not grant there ([`allows`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
    ServiceAccount, Toleration, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::requests::Request;

/// Where a [`Rule`] is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// In every namespace and on cluster-scoped resources: the ClusterRole [`NAME`], bound
    /// by a ClusterRoleBinding.
    Cluster,
    /// In each namespace that holds TalosClusters, and there only: the ClusterRole
    /// [`CLUSTER_NAMESPACE_ROLE`], bound in that namespace by a RoleBinding
    /// ([`cluster_namespace_binding`]) made with the cluster.
    ClusterNamespaces,
    /// In the operator's own namespace: the Role [`LEADER_ROLE`].
    OperatorNamespace,
    /// Cluster-wide, for Kubernetes upgrades only: the ClusterRole [`KUBERNETES_ROLE`],
    /// bound by a ClusterRoleBinding in the kustomize component
    /// `deploy/components/kubernetes-upgrades/` ([`kubernetes_upgrades_yaml`]), which a
    /// team that runs only Talos upgrades leaves out.
    KubernetesUpgrades,
}

/// One rule of the operator's roles, with the calls that need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Where it is granted.
    pub scope: Scope,
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// Resources, subresources as `pods/eviction`.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// The objects' names it is limited to (`resourceNames`); empty for any. The API server
    /// enforces them; [`allows`] does not see names (the request counts carry none).
    pub names: &'static [&'static str],
    /// What in the code needs it.
    pub why: &'static str,
}

/// A rule granted everywhere, for any name.
const fn everywhere(
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
    why: &'static str,
) -> Rule {
    Rule { scope: Scope::Cluster, group, resources, verbs, names: &[], why }
}

/// A rule granted for Kubernetes upgrades only ([`Scope::KubernetesUpgrades`]).
const fn kubernetes_upgrades(
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
    why: &'static str,
) -> Rule {
    Rule { scope: Scope::KubernetesUpgrades, group, resources, verbs, names: &[], why }
}

/// A list, for Kubernetes upgrades, of resources whose versions a Kubernetes release
/// removes.
const fn stranded_count(group: &'static str, resources: &'static [&'static str]) -> Rule {
    kubernetes_upgrades(
        group,
        resources,
        &["list"],
        "a Kubernetes upgrade's planning: objects stored of resources only removed versions serve, counted",
    )
}

/// The operator's permissions.
pub const RULES: &[Rule] = &[
    everywhere(
        "ichor.dev",
        &["talosoperations"],
        &["get", "list", "watch", "patch", "create", "delete"],
        "the controller's watch; an operation's existence is read fresh when it may hold a Lease; the finalizer; \
         an Automatic cluster's operations, made for its versions and collected when old",
    ),
    everywhere(
        "ichor.dev",
        &["talosoperations/status", "talosmachines/status", "talosclusters/status"],
        &["patch"],
        "status and conditions, by server-side apply",
    ),
    // An apply that makes the object is authorised as a create as well.
    everywhere(
        "ichor.dev",
        &["talosmachines"],
        &["create", "patch"],
        "discovery: a TalosMachine made from its Node, by server-side apply (spec.discovery: Nodes)",
    ),
    everywhere(
        "ichor.dev",
        &["talosmachines", "talosclusters", "talosstorages"],
        &["list", "watch"],
        "the reflector stores; the storage backend lists TalosStorages",
    ),
    everywhere(
        "",
        &["nodes"],
        &["list", "watch", "patch", "delete"],
        "the Node store; cordon before a removal; deleting a removed machine's Node",
    ),
    everywhere(
        "",
        &["pods"],
        &["list", "watch"],
        "the pod store the drain, the preflight gate and the dry run read; a draining node's pods, listed before \
         its reboot",
    ),
    everywhere(
        "apps",
        &["deployments", "statefulsets", "replicasets"],
        &["list", "watch"],
        "the preflight gate's store: workloads with one replica, or all their Ready pods on one node",
    ),
    everywhere(
        "policy",
        &["poddisruptionbudgets"],
        &["list", "watch"],
        "the preflight gate's store: budgets at zero over a node's pods",
    ),
    everywhere("", &["pods/eviction"], &["create"], "evictions, which PodDisruptionBudgets can refuse"),
    kubernetes_upgrades(
        "apps",
        &["daemonsets"],
        &["list"],
        "a Kubernetes upgrade's planning: kube-proxy's version (kube-system/kube-proxy)",
    ),
    // A Kubernetes upgrade's last step applies Talos's bootstrap manifests under the
    // cluster's admin kubeconfig, read over the Talos API for that step (decision 0014
    // rule 19), as `talosctl upgrade-k8s` does: the operator's own identity writes none of
    // them (no create or patch of workloads, CRDs or RBAC, no escalate or bind). It reads
    // the rollouts of their DaemonSets and Deployments itself.
    kubernetes_upgrades(
        "apps",
        &["daemonsets", "deployments"],
        &["get"],
        "a Kubernetes upgrade's last step: the rollouts of the bootstrap manifests' workloads",
    ),
    // A Kubernetes upgrade's planning counts the stored objects of resources that only
    // versions the target removes serve (`ichor_upgrade_core::kubernetes::removals`): list,
    // on every resource its table names (a test checks), except the two it names that
    // are not stored (selfsubjectreviews, apigroupdiscoveries).
    stranded_count(
        "admissionregistration.k8s.io",
        &[
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings",
        ],
    ),
    stranded_count("certificates.k8s.io", &["clustertrustbundles", "podcertificaterequests"]),
    stranded_count("coordination.k8s.io", &["leasecandidates"]),
    stranded_count("flowcontrol.apiserver.k8s.io", &["flowschemas", "prioritylevelconfigurations"]),
    stranded_count("lifecycle.k8s.io", &["evictions", "evictionrequests"]),
    stranded_count("networking.k8s.io", &["ipaddresses", "servicecidrs"]),
    stranded_count(
        "resource.k8s.io",
        &[
            "deviceclasses",
            "resourceclaims",
            "resourceclaimtemplates",
            "resourceslices",
            "devicetaintrules",
            "resourcepoolstatusrequests",
        ],
    ),
    stranded_count("scheduling.k8s.io", &["podgroups", "workloads"]),
    stranded_count("storage.k8s.io", &["volumeattributesclasses"]),
    stranded_count("storagemigration.k8s.io", &["storageversionmigrations"]),
    Rule {
        scope: Scope::ClusterNamespaces,
        group: "",
        resources: &["secrets"],
        verbs: &["get"],
        names: &[],
        why: "a cluster's talosconfig (spec.talosconfigSecret), in the cluster's namespace",
    },
    Rule {
        scope: Scope::ClusterNamespaces,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "create", "update"],
        names: &[],
        why: "the cluster lock, ichor-cluster-NAME in the cluster's namespace (written under resourceVersion)",
    },
    Rule {
        scope: Scope::OperatorNamespace,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "update"],
        names: &[LEADER_LEASE],
        why: "leader election: the replicas' Lease, read and renewed under resourceVersion",
    },
    Rule {
        scope: Scope::OperatorNamespace,
        group: "coordination.k8s.io",
        resources: &["leases"],
        // A create has no name to limit until it is made.
        verbs: &["create"],
        names: &[],
        why: "leader election: the Lease made by the first replica",
    },
    everywhere("events.k8s.io", &["events"], &["create", "patch"], "Events and their series"),
    everywhere(
        "longhorn.io",
        &["nodes"],
        &["get", "list", "watch", "patch"],
        "Longhorn's scheduling and eviction switches (read before an eviction, to put them back), watched",
    ),
    everywhere(
        "longhorn.io",
        &["replicas", "shards"],
        &["list", "watch"],
        "replicas and shards (Longhorn 1.12.1) left on a node",
    ),
    everywhere("longhorn.io", &["backingimages"], &["list"], "backing images with a file on a node a removal wipes"),
    Rule {
        scope: Scope::Cluster,
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["list", "watch"],
        names: &["nodes.longhorn.io", "shards.longhorn.io"],
        why: "whether Longhorn (and its shards) is installed, watched by name: no Longhorn request per machine \
              without it",
    },
];

/// Where the operator runs and which namespaces hold its TalosClusters: what the grants
/// of [`Scope::OperatorNamespace`] and [`Scope::ClusterNamespaces`] reach.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// The operator's namespace (its leader Lease's).
    pub operator_namespace: &'a str,
    /// The namespaces bound with [`cluster_namespace_binding`].
    pub cluster_namespaces: &'a [&'a str],
    /// Whether the Kubernetes-upgrade grants are bound ([`Scope::KubernetesUpgrades`]).
    pub kubernetes_upgrades: bool,
}

/// Whether [`RULES`] allow `request` for an operator placed as `placement` (names aside:
/// see [`Rule::names`]).
#[must_use]
pub fn allows(request: &Request, placement: &Placement<'_>) -> bool {
    let resource = if request.subresource.is_empty() {
        request.resource.clone()
    } else {
        format!("{}/{}", request.resource, request.subresource)
    };
    RULES.iter().any(|rule| {
        let reaches = match rule.scope {
            Scope::Cluster => true,
            Scope::ClusterNamespaces => placement.cluster_namespaces.contains(&request.namespace.as_str()),
            Scope::OperatorNamespace => request.namespace == placement.operator_namespace,
            Scope::KubernetesUpgrades => placement.kubernetes_upgrades,
        };
        reaches
            && rule.group == request.group
            && rule.resources.contains(&resource.as_str())
            && rule.verbs.contains(&request.verb.as_str())
    })
}

/// The names the manifests use: the ServiceAccount, the ClusterRole of [`Scope::Cluster`]
/// and its binding, the StatefulSet.
pub const NAME: &str = "ichor-operator";
/// The ClusterRole of [`Scope::ClusterNamespaces`], bound by a RoleBinding in each
/// namespace holding TalosClusters, never cluster-wide.
pub const CLUSTER_NAMESPACE_ROLE: &str = "ichor-operator-cluster-namespace";
/// The Role of [`Scope::OperatorNamespace`] and its RoleBinding.
pub const LEADER_ROLE: &str = "ichor-operator-leader";
/// The ClusterRole of [`Scope::KubernetesUpgrades`] and its ClusterRoleBinding.
pub const KUBERNETES_ROLE: &str = "ichor-operator-kubernetes-upgrades";
/// The leader election Lease, in the operator's namespace.
pub const LEADER_LEASE: &str = "ichor-operator";
/// The namespace the operator runs in.
pub const NAMESPACE: &str = "ichor-system";
/// The image the Deployment runs (built from `deploy/Dockerfile`).
pub const IMAGE: &str = "localhost/ichor-operator:0.1.0";
/// When the kubelet pulls [`IMAGE`]: a tag names one build.
pub const IMAGE_PULL_POLICY: &str = "IfNotPresent";
/// The port of `/metrics`, `/healthz` and `/readyz` in the Deployment.
pub const HTTP_PORT: i32 = 8080;

/// The policy rules of [`RULES`] granted in `scope`.
fn policy(scope: Scope) -> Vec<PolicyRule> {
    RULES
        .iter()
        .filter(|rule| rule.scope == scope)
        .map(|rule| PolicyRule {
            api_groups: Some(vec![rule.group.to_owned()]),
            resources: Some(rule.resources.iter().map(|r| (*r).to_owned()).collect()),
            verbs: rule.verbs.iter().map(|v| (*v).to_owned()).collect(),
            resource_names: (!rule.names.is_empty()).then(|| rule.names.iter().map(|n| (*n).to_owned()).collect()),
            ..PolicyRule::default()
        })
        .collect()
}

/// The URLs that name no resource the operator reads (granted `get` with
/// [`Scope::KubernetesUpgrades`]), with what needs each.
pub const NON_RESOURCE_URLS: &[(&str, &str)] = &[(
    "/metrics",
    "a Kubernetes upgrade's planning: the API server's apiserver_requested_deprecated_apis and request counts",
)];

/// The ClusterRole named `name` with the rules of [`Scope::Cluster`].
#[must_use]
pub fn cluster_role(name: &str) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta { name: Some(name.to_owned()), labels: Some(labels()), ..ObjectMeta::default() },
        rules: Some(policy(Scope::Cluster)),
        ..ClusterRole::default()
    }
}

/// The ClusterRole [`KUBERNETES_ROLE`]: the rules of [`Scope::KubernetesUpgrades`] and the
/// [`NON_RESOURCE_URLS`].
#[must_use]
pub fn kubernetes_upgrades_role() -> ClusterRole {
    let mut rules = policy(Scope::KubernetesUpgrades);
    rules.push(PolicyRule {
        non_resource_urls: Some(NON_RESOURCE_URLS.iter().map(|(url, _)| (*url).to_owned()).collect()),
        verbs: vec!["get".to_owned()],
        ..PolicyRule::default()
    });
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(KUBERNETES_ROLE.to_owned()),
            labels: Some(labels()),
            ..ObjectMeta::default()
        },
        rules: Some(rules),
        ..ClusterRole::default()
    }
}

/// The ClusterRole [`CLUSTER_NAMESPACE_ROLE`]: the rules of [`Scope::ClusterNamespaces`],
/// a template bound namespace by namespace ([`cluster_namespace_binding`]).
#[must_use]
pub fn cluster_namespace_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(CLUSTER_NAMESPACE_ROLE.to_owned()),
            labels: Some(labels()),
            ..ObjectMeta::default()
        },
        rules: Some(policy(Scope::ClusterNamespaces)),
        ..ClusterRole::default()
    }
}

/// The Role [`LEADER_ROLE`] in `namespace` (the operator's): the rules of
/// [`Scope::OperatorNamespace`].
#[must_use]
pub fn leader_role(namespace: &str) -> Role {
    Role { metadata: meta(LEADER_ROLE, Some(namespace)), rules: Some(policy(Scope::OperatorNamespace)) }
}

fn service_account(namespace: &str, account: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".to_owned(),
        name: account.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Subject::default()
    }
}

/// The RoleBinding of [`leader_role`] in `namespace` to the ServiceAccount `namespace/account`.
#[must_use]
pub fn leader_role_binding(namespace: &str, account: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(LEADER_ROLE, Some(namespace)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: LEADER_ROLE.to_owned(),
        },
        subjects: Some(vec![service_account(namespace, account)]),
    }
}

/// What grants the operator a namespace that holds TalosClusters: a RoleBinding named
/// [`NAME`] in `namespace` of the ClusterRole [`CLUSTER_NAMESPACE_ROLE`] to the
/// ServiceAccount `account_namespace/account`. `deploy/examples/cluster.yaml` carries it.
#[must_use]
pub fn cluster_namespace_binding(namespace: &str, account_namespace: &str, account: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(NAME, Some(namespace)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: CLUSTER_NAMESPACE_ROLE.to_owned(),
        },
        subjects: Some(vec![service_account(account_namespace, account)]),
    }
}

/// The command that grants the operator (ServiceAccount `account_namespace/account`) the
/// namespace `namespace`, as [`cluster_namespace_binding`] does.
#[must_use]
pub fn grant_command(namespace: &str, account_namespace: &str, account: &str) -> String {
    format!(
        "kubectl create rolebinding {NAME} --namespace {namespace} --clusterrole {CLUSTER_NAMESPACE_ROLE} \
         --serviceaccount {account_namespace}:{account}"
    )
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
        subjects: Some(vec![service_account(namespace, account)]),
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
pub(crate) fn stateful_set() -> StatefulSet {
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
        image_pull_policy: Some(IMAGE_PULL_POLICY.to_owned()),
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
pub(crate) fn disruption_budget() -> PodDisruptionBudget {
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
    let docs = [
        yaml(&Namespace { metadata: meta(NAMESPACE, None), ..Namespace::default() }),
        yaml(&ServiceAccount { metadata: meta(NAME, Some(NAMESPACE)), ..ServiceAccount::default() }),
        yaml(&cluster_role(NAME)),
        yaml(&cluster_role_binding(NAME, NAME, NAMESPACE, NAME)),
        yaml(&cluster_namespace_role()),
        yaml(&leader_role(NAMESPACE)),
        yaml(&leader_role_binding(NAMESPACE, NAME)),
        yaml(&stateful_set()),
        yaml(&disruption_budget()),
    ];
    generated(&docs)
}

/// `deploy/components/kubernetes-upgrades/kubernetes-upgrades.yaml`: the ClusterRole
/// [`KUBERNETES_ROLE`] and its ClusterRoleBinding to the operator's ServiceAccount.
///
/// # Panics
/// Never in practice: the objects are plain data that always serialize.
#[must_use]
pub fn kubernetes_upgrades_yaml() -> String {
    let docs = [
        yaml(&kubernetes_upgrades_role()),
        yaml(&cluster_role_binding(KUBERNETES_ROLE, KUBERNETES_ROLE, NAMESPACE, NAME)),
    ];
    generated(&docs)
}

/// `object` as a YAML document, with its apiVersion and kind.
fn yaml<T: serde::Serialize + k8s_openapi::Resource>(object: &T) -> String {
    serde_saphyr::to_string(&typed(object)).expect("an object serializes to YAML")
}

/// `object` as JSON, with its apiVersion and kind.
pub(crate) fn typed<T: serde::Serialize + k8s_openapi::Resource>(object: &T) -> serde_json::Value {
    let mut value = serde_json::to_value(object).expect("an object serializes");
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".to_owned(), T::API_VERSION.into());
        map.insert("kind".to_owned(), T::KIND.into());
    }
    value
}

/// `docs` as one generated file.
fn generated(docs: &[String]) -> String {
    format!(
        "# Generated from crates/ichor-operator/src/rbac.rs; do not edit.\n# Regenerate: ICHOR_WRITE_MANIFESTS=1 cargo test -p ichor-operator --test suite manifests\n---\n{}",
        docs.join("---\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(verb: &str, group: &str, resource: &str, subresource: &str) -> Request {
        request_in("", verb, group, resource, subresource)
    }

    fn request_in(namespace: &str, verb: &str, group: &str, resource: &str, subresource: &str) -> Request {
        Request {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: namespace.to_owned(),
        }
    }

    const PLACED: Placement<'static> =
        Placement { operator_namespace: NAMESPACE, cluster_namespaces: &["prod"], kubernetes_upgrades: true };

    #[test]
    fn the_rules_allow_what_they_name_and_nothing_near_it() {
        let allows = |r: &Request| allows(r, &PLACED);
        assert!(allows(&request("create", "", "pods", "eviction")));
        assert!(!allows(&request("create", "", "pods", "")), "creating pods is not evicting them");
        assert!(allows(&request("patch", "ichor.dev", "talosoperations", "status")));
        assert!(!allows(&request("update", "ichor.dev", "talosoperations", "status")));
        // An Automatic cluster's old operations are collected; no cluster or machine is deleted.
        assert!(allows(&request("delete", "ichor.dev", "talosoperations", "")));
        assert!(!allows(&request("delete", "ichor.dev", "talosclusters", "")));
        assert!(!allows(&request("delete", "ichor.dev", "talosmachines", "")));
        assert!(!allows(&request_in("prod", "list", "", "secrets", "")), "one named Secret at a time");
        assert!(!allows(&request("patch", "", "nodes", "status")), "the operator never writes a Node's status");
        assert!(allows(&request("patch", "longhorn.io", "nodes", "")));
        assert!(!allows(&request("delete", "longhorn.io", "nodes", "")), "a group's nodes are not another's");
    }

    /// Issue 31 item 10: Secrets and Leases only where the operator needs them.
    #[test]
    fn secrets_and_leases_are_granted_only_in_their_namespaces() {
        let allows = |r: &Request| allows(r, &PLACED);
        assert!(allows(&request_in("prod", "get", "", "secrets", "")), "the cluster's talosconfig");
        assert!(!allows(&request_in("kube-system", "get", "", "secrets", "")), "no other namespace's Secrets");
        assert!(!allows(&request_in(NAMESPACE, "get", "", "secrets", "")), "not even its own namespace's");
        for verb in ["get", "create", "update"] {
            assert!(allows(&request_in("prod", verb, "coordination.k8s.io", "leases", "")), "the lock: {verb}");
            assert!(allows(&request_in(NAMESPACE, verb, "coordination.k8s.io", "leases", "")), "the leader: {verb}");
            assert!(!allows(&request_in("kube-system", verb, "coordination.k8s.io", "leases", "")), "{verb}");
            assert!(!allows(&request_in("kube-node-lease", verb, "coordination.k8s.io", "leases", "")), "{verb}");
        }
        assert!(!allows(&request_in(NAMESPACE, "patch", "coordination.k8s.io", "leases", "")));
        for rule in RULES.iter().filter(|r| r.scope == Scope::Cluster) {
            assert!(
                !rule.resources.iter().any(|r| *r == "secrets" || *r == "leases"),
                "no cluster-wide grant of Secrets or Leases: {rule:?}"
            );
        }
        // The leader Lease is granted by name: the Role says so to the API server.
        let role = leader_role(NAMESPACE);
        let renew = role.rules.iter().flatten().find(|r| r.verbs.contains(&"update".to_owned())).unwrap();
        assert_eq!(renew.resource_names.as_deref(), Some(&[LEADER_LEASE.to_owned()][..]));
    }

    #[test]
    fn the_manifests_bind_each_scope_where_it_belongs() {
        let yaml = operator_yaml();
        let docs: Vec<serde_json::Value> =
            yaml.split("\n---\n").skip(1).map(|d| serde_saphyr::from_str(d).expect("a YAML document")).collect();
        let kinds: Vec<(&str, &str)> =
            docs.iter().map(|d| (d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap())).collect();
        assert!(kinds.contains(&("ClusterRoleBinding", NAME)));
        assert!(kinds.contains(&("ClusterRole", CLUSTER_NAMESPACE_ROLE)));
        assert!(kinds.contains(&("Role", LEADER_ROLE)) && kinds.contains(&("RoleBinding", LEADER_ROLE)));
        for binding in docs.iter().filter(|d| d["kind"] == "ClusterRoleBinding") {
            assert_eq!(binding["roleRef"]["name"], NAME, "only the cluster-wide rules are bound cluster-wide");
        }
        let text = grant_command("prod", NAMESPACE, NAME);
        assert_eq!(
            text,
            "kubectl create rolebinding ichor-operator --namespace prod --clusterrole ichor-operator-cluster-namespace \
             --serviceaccount ichor-system:ichor-operator"
        );
    }

    #[test]
    fn every_resource_the_removal_table_names_may_be_counted() {
        let allows = |r: &Request| allows(r, &PLACED);
        let not_stored = ["selfsubjectreviews", "apigroupdiscoveries"];
        for api in ichor_upgrade_core::kubernetes::removals::removed_apis() {
            let list = request("list", api.group, api.resource, "");
            assert_eq!(allows(&list), !not_stored.contains(&api.resource), "{api:?}");
            assert!(!allows(&request("get", api.group, api.resource, "")), "{api:?}");
        }
    }

    /// Issue 53 item 12: the ServiceAccount cannot bind itself to cluster-admin, nor write
    /// workloads or CRDs cluster-wide: no escalate or bind, no create, patch or update of
    /// RBAC, workloads, CRDs, ServiceAccounts, ConfigMaps or Services, in any scope.
    #[test]
    fn no_grant_escalates_binds_or_writes_workloads_crds_or_rbac() {
        let writes = ["create", "patch", "update", "delete", "escalate", "bind", "impersonate"];
        let guarded = [
            ("rbac.authorization.k8s.io", "clusterroles"),
            ("rbac.authorization.k8s.io", "clusterrolebindings"),
            ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"),
            ("apiextensions.k8s.io", "customresourcedefinitions"),
            ("apps", "daemonsets"),
            ("apps", "deployments"),
            ("apps", "statefulsets"),
            ("", "serviceaccounts"),
            ("", "configmaps"),
            ("", "services"),
        ];
        for rule in RULES {
            assert!(!rule.verbs.iter().any(|v| *v == "escalate" || *v == "bind" || *v == "impersonate"), "{rule:?}");
            for (group, resource) in guarded {
                let hit = rule.group == group && rule.resources.contains(&resource);
                assert!(!(hit && rule.verbs.iter().any(|v| writes.contains(v))), "{rule:?} writes {resource}");
            }
        }
        for (group, resource) in guarded {
            for verb in writes {
                assert!(!allows(&request(verb, group, resource, ""), &PLACED), "{verb} {resource}");
            }
        }
    }

    /// A Talos-only install (no `deploy/components/kubernetes-upgrades/`) grants nothing a
    /// Kubernetes upgrade alone needs; the component grants exactly those reads.
    #[test]
    fn the_kubernetes_upgrade_reads_are_granted_only_by_their_component() {
        let talos_only = Placement { kubernetes_upgrades: false, ..PLACED };
        for (verb, group, resource) in [
            ("list", "apps", "daemonsets"),
            ("get", "apps", "deployments"),
            ("list", "resource.k8s.io", "resourceslices"),
        ] {
            assert!(allows(&request(verb, group, resource, ""), &PLACED), "{verb} {resource}");
            assert!(!allows(&request(verb, group, resource, ""), &talos_only), "{verb} {resource}");
        }
        // What a Talos upgrade needs stays in the base role.
        assert!(allows(&request("create", "", "pods", "eviction"), &talos_only));
        assert!(allows(&request("list", "", "pods", ""), &talos_only));
        let base = operator_yaml();
        assert!(!base.contains(KUBERNETES_ROLE) && !base.contains("- /metrics"), "{base}");
        let component = kubernetes_upgrades_yaml();
        assert!(component.contains("kind: ClusterRoleBinding") && component.contains("- /metrics"), "{component}");
        for rule in RULES.iter().filter(|r| r.scope == Scope::KubernetesUpgrades) {
            assert!(rule.verbs.iter().all(|v| ["get", "list"].contains(v)), "reads only: {rule:?}");
        }
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
