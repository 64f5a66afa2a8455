//! A Talos machine configuration, as far as a Kubernetes upgrade reads and changes it: the
//! image and the extra arguments of each Kubernetes component, and whether Talos manages
//! kube-proxy.
//!
//! The configuration is the multi-document YAML a node holds (`MachineConfigs` `v1alpha1`,
//! `docs/kubernetes-upgrade-facts.md` §2). Where the images live:
//!
//! | component | `v1alpha1` document | its own document (Talos 1.14+, when present) |
//! |---|---|---|
//! | kube-apiserver | `cluster.apiServer.image` | `KubeAPIServerConfig` `image` |
//! | kube-controller-manager | `cluster.controllerManager.image` | `KubeControllerManagerConfig` `image` |
//! | kube-scheduler | `cluster.scheduler.image` | `KubeSchedulerConfig` `image` |
//! | kube-proxy | `cluster.proxy.image` | `KubeProxyConfig` `image` |
//! | kubelet | `machine.kubelet.image` | `KubeletConfig` `image` |
//!
//! A component's own document, when the configuration has one, is where its image is read
//! and changed, as Talos's own patching chooses. Everything else in the configuration is
//! kept as it was read (comments aside: the YAML is re-encoded, as `talosctl` does).

use std::collections::BTreeMap;

use ichor_upgrade_core::kubernetes::component::Component;
use serde_json::Value;

/// A configuration that could not be read or changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("machine configuration: {0}")]
pub struct MachineConfigError(String);

/// A node's machine configuration, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineConfig {
    documents: Vec<Value>,
}

/// The multi-document kind holding each component's configuration.
fn document_kind(component: Component) -> &'static str {
    match component {
        Component::KubeApiserver => "KubeAPIServerConfig",
        Component::KubeControllerManager => "KubeControllerManagerConfig",
        Component::KubeScheduler => "KubeSchedulerConfig",
        Component::KubeProxy => "KubeProxyConfig",
        Component::Kubelet => "KubeletConfig",
    }
}

/// The path of a component's image in the `v1alpha1` document.
fn v1alpha1_path(component: Component) -> [&'static str; 3] {
    match component {
        Component::KubeApiserver => ["cluster", "apiServer", "image"],
        Component::KubeControllerManager => ["cluster", "controllerManager", "image"],
        Component::KubeScheduler => ["cluster", "scheduler", "image"],
        Component::KubeProxy => ["cluster", "proxy", "image"],
        Component::Kubelet => ["machine", "kubelet", "image"],
    }
}

impl MachineConfig {
    /// Parses a configuration as a node returns it.
    ///
    /// # Errors
    /// Not UTF-8, not YAML, or with no `v1alpha1` document (a node rejects such a
    /// configuration outside maintenance).
    pub fn parse(bytes: &[u8]) -> Result<Self, MachineConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| MachineConfigError(format!("not UTF-8: {e}")))?;
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| MachineConfigError(format!("not YAML: {e}")))?;
        let documents: Vec<Value> = documents.into_iter().filter(|d| !d.is_null()).collect();
        let config = Self { documents };
        if config.v1alpha1().is_none() {
            return Err(MachineConfigError("it has no v1alpha1 document (version: v1alpha1)".to_owned()));
        }
        Ok(config)
    }

    /// The configuration as YAML, to apply.
    ///
    /// # Errors
    /// A value YAML cannot hold (never for a configuration that was parsed).
    pub fn to_yaml(&self) -> Result<Vec<u8>, MachineConfigError> {
        serde_saphyr::to_string_multiple(&self.documents)
            .map(String::into_bytes)
            .map_err(|e| MachineConfigError(format!("cannot encode: {e}")))
    }

    fn v1alpha1(&self) -> Option<&Value> {
        self.documents.iter().find(|d| d.get("version").and_then(Value::as_str) == Some("v1alpha1"))
    }

    fn own_document(&self, component: Component) -> Option<usize> {
        let kind = document_kind(component);
        self.documents.iter().position(|d| d.get("kind").and_then(Value::as_str) == Some(kind))
    }

    /// The image the configuration sets for `component`, if it sets one (none: Talos's
    /// default for its version).
    #[must_use]
    pub fn image(&self, component: Component) -> Option<String> {
        let found = match self.own_document(component) {
            Some(i) => self.documents[i].get("image"),
            None => {
                let [a, b, c] = v1alpha1_path(component);
                self.v1alpha1().and_then(|d| d.get(a)).and_then(|v| v.get(b)).and_then(|v| v.get(c))
            }
        };
        found.and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned)
    }

    /// Every image the configuration sets, by component.
    #[must_use]
    pub fn images(&self) -> BTreeMap<Component, String> {
        Component::ALL.into_iter().filter_map(|c| self.image(c).map(|image| (c, image))).collect()
    }

    /// Whether Talos runs kube-proxy for this cluster (`cluster.proxy.disabled`, or
    /// `KubeProxyConfig` `enabled`; enabled unless said otherwise).
    #[must_use]
    pub fn kube_proxy_enabled(&self) -> bool {
        if let Some(i) = self.own_document(Component::KubeProxy) {
            return self.documents[i].get("enabled").and_then(Value::as_bool) != Some(false);
        }
        let disabled = self
            .v1alpha1()
            .and_then(|d| d.get("cluster"))
            .and_then(|c| c.get("proxy"))
            .and_then(|p| p.get("disabled"))
            .and_then(Value::as_bool);
        disabled != Some(true)
    }

    /// The same configuration with `component`'s image set to `image`.
    ///
    /// # Errors
    /// A document on the way is not a mapping.
    pub fn with_image(&self, component: Component, image: &str) -> Result<Self, MachineConfigError> {
        let mut next = self.clone();
        if let Some(i) = next.own_document(component) {
            let Value::Object(document) = &mut next.documents[i] else {
                return Err(MachineConfigError(format!("{} is not a mapping", document_kind(component))));
            };
            document.insert("image".to_owned(), Value::String(image.to_owned()));
            return Ok(next);
        }
        let [a, b, c] = v1alpha1_path(component);
        let document = next
            .documents
            .iter_mut()
            .find(|d| d.get("version").and_then(Value::as_str) == Some("v1alpha1"))
            .ok_or_else(|| MachineConfigError("it has no v1alpha1 document".to_owned()))?;
        let mut at = document;
        for key in [a, b] {
            let Value::Object(map) = at else {
                return Err(MachineConfigError(format!("{key}'s parent is not a mapping")));
            };
            at = map.entry(key.to_owned()).or_insert_with(|| Value::Object(serde_json::Map::new()));
        }
        let Value::Object(map) = at else {
            return Err(MachineConfigError(format!("{a}.{b} is not a mapping")));
        };
        map.insert(c.to_owned(), Value::String(image.to_owned()));
        Ok(next)
    }
}

/// A scalar of an `extraArgs` value as the component gets it (`true`, `24`, `text`); a
/// mapping or a null gives nothing.
fn arg_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

impl MachineConfig {
    /// The extra arguments the configuration sets for `component`, as `(name, value)`: its
    /// own document's `extraArgs` when it has one, else the `v1alpha1` document's
    /// (`cluster.apiServer.extraArgs`, `machine.kubelet.extraArgs`, ...). A value may be a
    /// scalar or a list of them (one pair per item). The kubelet's
    /// `machine.kubelet.extraConfig.featureGates` (the kubelet's configuration file) is given
    /// as one more `feature-gates` argument, for they are read the same way.
    #[must_use]
    pub fn extra_args(&self, component: Component) -> Vec<(String, String)> {
        let [a, b, _] = v1alpha1_path(component);
        let section = self.v1alpha1().and_then(|d| d.get(a)).and_then(|v| v.get(b));
        let found = match self.own_document(component) {
            Some(i) => self.documents[i].get("extraArgs"),
            None => section.and_then(|s| s.get("extraArgs")),
        };
        let mut args = Vec::new();
        if let Some(Value::Object(map)) = found {
            for (name, value) in map {
                match value {
                    Value::Array(items) => args.extend(items.iter().filter_map(arg_text).map(|v| (name.clone(), v))),
                    other => args.extend(arg_text(other).map(|v| (name.clone(), v))),
                }
            }
        }
        if component == Component::Kubelet
            && let Some(Value::Object(gates)) =
                section.and_then(|s| s.get("extraConfig")).and_then(|c| c.get("featureGates"))
        {
            let list: Vec<String> =
                gates.iter().filter_map(|(gate, on)| arg_text(on).map(|on| format!("{gate}={on}"))).collect();
            if !list.is_empty() {
                args.push(("feature-gates".to_owned(), list.join(",")));
            }
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape `talosctl gen config` writes (abridged), with a kubelet document of its own.
    const CONFIG: &str = "\
version: v1alpha1
debug: false
machine:
  type: controlplane
  token: abc.def
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v1.34.2
    defaultRuntimeSeccompProfileEnabled: true
cluster:
  clusterName: prod
  apiServer:
    image: registry.k8s.io/kube-apiserver:v1.34.2
    certSANs:
      - 127.0.0.1
  controllerManager:
    image: registry.k8s.io/kube-controller-manager:v1.34.2
  proxy:
    image: registry.k8s.io/kube-proxy:v1.34.2
  scheduler:
    image: registry.k8s.io/kube-scheduler:v1.34.2
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
";

    #[test]
    fn images_are_read_where_talos_keeps_them_and_set_without_touching_the_rest() {
        let config = MachineConfig::parse(CONFIG.as_bytes()).unwrap();
        assert_eq!(config.images().len(), 5);
        assert_eq!(config.image(Component::KubeScheduler).as_deref(), Some("registry.k8s.io/kube-scheduler:v1.34.2"));
        assert!(config.kube_proxy_enabled());
        let next = config.with_image(Component::KubeApiserver, "registry.k8s.io/kube-apiserver:v1.35.0").unwrap();
        let reread = MachineConfig::parse(&next.to_yaml().unwrap()).unwrap();
        assert_eq!(reread.image(Component::KubeApiserver).as_deref(), Some("registry.k8s.io/kube-apiserver:v1.35.0"));
        // Everything else kept, the other documents included.
        let back = reread.with_image(Component::KubeApiserver, "registry.k8s.io/kube-apiserver:v1.34.2").unwrap();
        assert_eq!(back, config);
        assert_eq!(reread.documents.len(), 2);
    }

    #[test]
    fn a_components_own_document_wins_and_an_absent_image_is_added() {
        let text = format!(
            "{CONFIG}---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: mirror:5000/kubelet:v1.34.2\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\n"
        );
        let config = MachineConfig::parse(text.as_bytes()).unwrap();
        assert_eq!(config.image(Component::Kubelet).as_deref(), Some("mirror:5000/kubelet:v1.34.2"));
        assert!(!config.kube_proxy_enabled());
        assert_eq!(config.image(Component::KubeProxy), None, "its own document sets none");
        let next = config.with_image(Component::Kubelet, "mirror:5000/kubelet:v1.35.0").unwrap();
        assert_eq!(
            next.v1alpha1().unwrap()["machine"]["kubelet"]["image"],
            "ghcr.io/siderolabs/kubelet:v1.34.2",
            "the v1alpha1 field is left as it was"
        );
        let bare = MachineConfig::parse(b"version: v1alpha1\nmachine:\n  type: worker\n").unwrap();
        let set = bare.with_image(Component::Kubelet, "ghcr.io/siderolabs/kubelet:v1.35.0").unwrap();
        assert_eq!(set.image(Component::Kubelet).as_deref(), Some("ghcr.io/siderolabs/kubelet:v1.35.0"));
    }

    #[test]
    fn extra_args_are_read_from_v1alpha1_or_the_components_own_document_scalars_and_lists() {
        let text = "\
version: v1alpha1
machine:
  type: controlplane
  kubelet:
    extraArgs:
      rotate-server-certificates: true
      node-labels: [a=b, c=d]
    extraConfig:
      featureGates:
        SomeGate: false
cluster:
  apiServer:
    extraArgs:
      feature-gates: UserNamespacesSupport=true
      enable-admission-plugins: NodeRestriction
  controllerManager:
    extraArgs:
      node-cidr-mask-size-ipv4: 24
---
apiVersion: v1alpha1
kind: KubeSchedulerConfig
extraArgs:
  v: \"2\"
";
        let config = MachineConfig::parse(text.as_bytes()).unwrap();
        let pairs = |c| {
            let mut args = config.extra_args(c);
            args.sort();
            args.into_iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>()
        };
        assert_eq!(
            pairs(Component::Kubelet),
            ["feature-gates=SomeGate=false", "node-labels=a=b", "node-labels=c=d", "rotate-server-certificates=true"]
        );
        assert_eq!(
            pairs(Component::KubeApiserver),
            ["enable-admission-plugins=NodeRestriction", "feature-gates=UserNamespacesSupport=true"]
        );
        assert_eq!(pairs(Component::KubeControllerManager), ["node-cidr-mask-size-ipv4=24"]);
        assert_eq!(pairs(Component::KubeScheduler), ["v=2"], "its own document");
        assert_eq!(pairs(Component::KubeProxy), Vec::<String>::new());
    }

    #[test]
    fn a_configuration_without_v1alpha1_or_not_yaml_is_refused_naming_why() {
        let no_v1 = MachineConfig::parse(b"apiVersion: v1alpha1\nkind: HostnameConfig\n").unwrap_err();
        assert!(no_v1.to_string().contains("no v1alpha1 document"), "{no_v1}");
        let not_yaml = MachineConfig::parse(b"version: [v1alpha1\n").unwrap_err();
        assert!(not_yaml.to_string().contains("not YAML"), "{not_yaml}");
        assert!(MachineConfig::parse(&[0xff, 0xfe]).unwrap_err().to_string().contains("not UTF-8"));
    }
}
