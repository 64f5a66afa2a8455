//! Every Kubernetes request the operator makes, counted by RBAC verb and resource.
//!
//! A tower layer in front of the kube-rs client classifies each request as the API
//! server's authorizer does (`get`, `list`, `watch`, `create`, `update`, `patch`,
//! `delete`, `deletecollection` on a group, resource and subresource) and counts it in
//! `ichor_kube_requests_total`. The same classification is what the ClusterRole in
//! `deploy/` is checked against ([`crate::rbac`]): the end-to-end tests read the counts
//! from `/metrics` and fail on any request the role does not name.

use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// One kind of request, as RBAC sees it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct Request {
    /// The RBAC verb.
    pub verb: String,
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource (`status`, `eviction`), or `""`.
    pub subresource: String,
    /// The namespace of a namespaced request, `""` for one across namespaces or of a
    /// cluster-scoped resource (what a RoleBinding's grant is checked against).
    pub namespace: String,
}

/// The requests counted so far.
pub type RequestCounts = Family<Request, Counter>;

/// How the API server's authorizer names a request to `path` (with `query`) by `method`;
/// `None` for a non-resource request (discovery, `/version`).
#[must_use]
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> Option<Request> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, resource, name, subresource) = match rest {
        [] => return None,
        ["namespaces", ns, resource, tail @ ..] => (*ns, *resource, tail.first(), tail.get(1)),
        [resource, tail @ ..] => ("", *resource, tail.first(), tail.get(1)),
    };
    let watching = query.is_some_and(|q| q.split('&').any(|pair| pair == "watch=true" || pair == "watch=1"));
    let verb = match *method {
        http::Method::GET if name.is_some() => "get",
        http::Method::GET if watching => "watch",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if name.is_some() => "delete",
        http::Method::DELETE => "deletecollection",
        _ => return None,
    };
    Some(Request {
        verb: verb.to_owned(),
        group: group.to_owned(),
        resource: resource.to_owned(),
        subresource: subresource.map(|s| (*s).to_owned()).unwrap_or_default(),
        namespace: namespace.to_owned(),
    })
}

/// The layer that counts requests into a [`RequestCounts`].
#[derive(Debug, Clone)]
pub struct CountRequests {
    counts: RequestCounts,
}

impl CountRequests {
    /// Counting into `counts`.
    #[must_use]
    pub fn new(counts: RequestCounts) -> Self {
        Self { counts }
    }
}

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted { inner, counts: self.counts.clone() }
    }
}

/// A service whose requests are counted.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    counts: RequestCounts,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if let Some(kind) = classify(request.method(), request.uri().path(), request.uri().query()) {
            self.counts.get_or_create(&kind).inc();
        }
        self.inner.call(request)
    }
}

/// A client for `config` whose requests are counted into `counts`, with kube-rs's own
/// retries off (as [`ichor_adapters::kubernetes::client()`]).
///
/// # Errors
/// The kube-rs error when no client can be built from `config`.
pub fn counted_client(mut config: kube::Config, counts: &RequestCounts) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&CountRequests::new(counts.clone())).build())
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    fn named(method: Method, path: &str, query: Option<&str>) -> (String, String, String, String) {
        let r = classify(&method, path, query).expect("a resource request");
        (r.verb, r.group, r.resource, r.subresource)
    }

    fn namespace(method: Method, path: &str) -> String {
        classify(&method, path, None).expect("a resource request").namespace
    }

    fn t(verb: &str, group: &str, resource: &str, sub: &str) -> (String, String, String, String) {
        (verb.into(), group.into(), resource.into(), sub.into())
    }

    #[test]
    fn requests_are_named_as_the_authorizer_names_them() {
        assert_eq!(named(Method::GET, "/api/v1/nodes", Some("limit=500")), t("list", "", "nodes", ""));
        assert_eq!(
            named(Method::GET, "/api/v1/nodes", Some("watch=true&resourceVersion=5")),
            t("watch", "", "nodes", "")
        );
        assert_eq!(named(Method::PATCH, "/api/v1/nodes/n1", None), t("patch", "", "nodes", ""));
        assert_eq!(named(Method::DELETE, "/api/v1/nodes/n1", None), t("delete", "", "nodes", ""));
        assert_eq!(
            named(Method::POST, "/api/v1/namespaces/a/pods/p/eviction", None),
            t("create", "", "pods", "eviction")
        );
        assert_eq!(
            named(Method::PATCH, "/apis/ichor.dev/v1alpha1/namespaces/a/talosoperations/op/status", None),
            t("patch", "ichor.dev", "talosoperations", "status")
        );
        assert_eq!(
            named(Method::GET, "/apis/ichor.dev/v1alpha1/talosstorages", None),
            t("list", "ichor.dev", "talosstorages", "")
        );
        assert_eq!(
            named(Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/a/leases/l", None),
            t("update", "coordination.k8s.io", "leases", "")
        );
        assert_eq!(named(Method::GET, "/api/v1/namespaces/a", None), t("get", "", "namespaces", ""));
        assert_eq!(named(Method::GET, "/api/v1/namespaces/a/secrets/s", None), t("get", "", "secrets", ""));
        assert_eq!(named(Method::DELETE, "/api/v1/namespaces/a/pods", None), t("deletecollection", "", "pods", ""));
    }

    #[test]
    fn a_namespaced_request_names_its_namespace_and_no_other_does() {
        assert_eq!(namespace(Method::GET, "/api/v1/namespaces/prod/secrets/s"), "prod");
        assert_eq!(
            namespace(Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/ichor-system/leases/l"),
            "ichor-system"
        );
        assert_eq!(namespace(Method::GET, "/apis/ichor.dev/v1alpha1/talosoperations"), "", "across namespaces");
        assert_eq!(namespace(Method::GET, "/api/v1/nodes/n1"), "", "cluster-scoped");
        assert_eq!(namespace(Method::GET, "/api/v1/namespaces/prod"), "", "a Namespace is cluster-scoped");
    }

    #[test]
    fn discovery_is_not_a_resource_request() {
        assert_eq!(classify(&Method::GET, "/apis/longhorn.io/v1beta2", None), None);
        assert_eq!(classify(&Method::GET, "/api/v1", None), None);
        assert_eq!(classify(&Method::GET, "/version", None), None);
        assert_eq!(classify(&Method::GET, "/apis", None), None);
    }
}
