//! Every kube-rs error mapped once to a [`KubeError`] kind, transient or not; nothing
//! downstream reads the text.
//!
//! | error | kind |
//! | --- | --- |
//! | HTTP 409 | `Conflict` (a lost race: transient) |
//! | HTTP 404 | `NotFound` |
//! | HTTP 429, 500–599, 410 (a watch's history expired) | `Unreachable` (transient) |
//! | HTTP 403 | `Forbidden` (RBAC: a person grants it) |
//! | any other HTTP status (400, 401, 405, 422, ...) | `Refused` |
//! | no connection, a broken one, a timeout, a broken watch stream | `Unreachable` |
//! | TLS, a kubeconfig that does not load, a response that does not parse, a request that cannot be built | `Refused`: waiting does not fix it |

use ichor_executor::cause::report;
use ichor_executor::kube_api::KubeError;

/// Maps a kube-rs error from `what` (the call, such as `patch TalosMachine m-1 status`).
#[must_use]
pub fn kube_error(what: &str, error: &kube::Error) -> KubeError {
    let message = format!("{what}: {}", report(error));
    match error {
        kube::Error::Api(status) => match status.code {
            409 => KubeError::Conflict(message),
            404 => KubeError::NotFound(message),
            403 => KubeError::Forbidden(message),
            410 | 429 | 500..=599 => KubeError::Unreachable(message),
            _ => KubeError::Refused(message),
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            if is_tls(error) {
                KubeError::Refused(message)
            } else {
                KubeError::Unreachable(message)
            }
        }
        _ => KubeError::Refused(message),
    }
}

/// Whether a TLS failure lies anywhere in the error's chain (a certificate the client does
/// not trust, or that the server refuses): a configuration problem, not an outage.
fn is_tls(error: &kube::Error) -> bool {
    contains_tls(error)
}

/// Walks `source()`, and into IO errors (which hide what they wrap from `source()`: the
/// connector reports a rustls error inside an IO error inside another).
fn contains_tls(error: &(dyn std::error::Error + 'static)) -> bool {
    if error.is::<rustls::Error>() || error.is::<kube::client::RustlsTlsError>() {
        return true;
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>()
        && let Some(inner) = io.get_ref()
        && contains_tls(inner)
    {
        return true;
    }
    error.source().is_some_and(contains_tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure("the server said so", "Reason").with_code(code)))
    }

    #[test]
    fn http_statuses_map_to_their_kinds() {
        assert!(matches!(kube_error("x", &api(409)), KubeError::Conflict(_)));
        assert!(matches!(kube_error("x", &api(404)), KubeError::NotFound(_)));
        for code in [410, 429, 500, 503, 504] {
            let e = kube_error("x", &api(code));
            assert!(matches!(e, KubeError::Unreachable(_)) && e.is_transient(), "{code}: {e:?}");
        }
        for code in [400, 401, 405, 422] {
            let e = kube_error("x", &api(code));
            assert!(matches!(e, KubeError::Refused(_)) && !e.is_transient(), "{code}: {e:?}");
        }
        let e = kube_error("x", &api(403));
        assert!(matches!(e, KubeError::Forbidden(_)) && !e.is_transient(), "403: {e:?}");
        assert!(kube_error("patch TalosMachine m-1 status", &api(422)).to_string().contains("patch TalosMachine m-1"));
    }

    #[test]
    fn transport_errors_are_unreachable_and_tls_errors_are_refused() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = kube_error("x", &kube::Error::Service(Box::new(refused)));
        assert!(matches!(&e, KubeError::Unreachable(m) if m.contains("connection refused")), "{e:?}");
        // As hyper-util reports it: the rustls error inside an IO error inside another.
        let tls = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ));
        let e = kube_error("x", &kube::Error::Service(Box::new(tls)));
        assert!(matches!(&e, KubeError::Refused(m) if m.contains("UnknownIssuer")), "{e:?}");
        let e = kube_error("x", &kube::Error::TlsRequired);
        assert!(matches!(e, KubeError::Refused(_)));
    }
}
