//! Connecting to apid: mutual TLS from a talosconfig, and a connection that is either fully
//! up within the dial bound or a typed [`ConnectError`].
//!
//! tonic's own lazy connector bounds only the TCP connect: a peer that accepts TCP and
//! never speaks TLS held a channel for as long as the process lived. This connector does
//! every step under one deadline: name resolution, TCP, the TLS handshake, and the
//! server's first bytes. Waiting for those bytes matters with TLS 1.3, where the client's
//! handshake ends before the server has checked the client certificate: a server that
//! refuses it answers with an alert instead of its HTTP/2 SETTINGS, and the refusal is then
//! a connection error of its own kind (never a request that may have been delivered).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use ichor_talosconfig::{Endpoint, TalosContext};
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;

/// TCP keepalive on apid connections: a peer that vanished (a node that rebooted without
/// closing its sockets) is noticed within about a minute, not after the kernel's fifteen.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// The interval between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// Why no connection to an apid endpoint could be made. Every variant means the request
/// was never sent.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The host name did not resolve.
    #[error("no such host {host}")]
    Resolve {
        /// The host.
        host: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// No TCP connection could be opened.
    #[error("TCP to {addr}: {summary}")]
    Tcp {
        /// The address tried last.
        addr: SocketAddr,
        /// What the error means, in words (`connection refused`, `host unreachable`).
        summary: &'static str,
        /// The socket's error.
        #[source]
        source: io::Error,
    },
    /// The TLS handshake failed, or the server refused this client's certificate.
    #[error("TLS handshake: {source}")]
    Tls {
        /// rustls's error (an invalid peer certificate, a received alert), inside an
        /// `io::Error` as tokio-rustls reports it.
        #[source]
        source: io::Error,
    },
    /// A step did not finish within the dial bound.
    #[error("{step} did not complete within {bound:?}")]
    TimedOut {
        /// The step: `name resolution`, `TCP connect`, `TLS handshake`, or the server's
        /// first HTTP/2 frame.
        step: &'static str,
        /// The dial bound.
        bound: Duration,
    },
    /// The server closed the connection right after the handshake.
    #[error("the server closed the connection after the TLS handshake{}", .source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Closed {
        /// The socket's error, if it gave one.
        #[source]
        source: Option<io::Error>,
    },
}

impl ConnectError {
    /// Whether TLS failed (a certificate or protocol problem that waiting does not fix).
    #[must_use]
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls { .. })
    }
}

/// What is wrong with a context's TLS material, found before any connection is attempted.
#[derive(Debug, thiserror::Error)]
pub enum TlsMaterialError {
    /// A CA or client certificate block does not parse.
    #[error("{field}: {source}")]
    Pem {
        /// `ca`, `crt` or `key`.
        field: &'static str,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The CA bundle holds no usable certificate.
    #[error("ca: {0}")]
    Roots(String),
    /// rustls refused the client certificate and key (an unsupported key type, or a key
    /// that does not belong to the certificate).
    #[error("crt/key: {0}")]
    Identity(#[source] rustls::Error),
}

/// The mutual-TLS client configuration of a context: its CA as the only trust anchor, its
/// certificate and key as the client identity, HTTP/2 by ALPN (apid, as every gRPC-Go
/// server since 1.67, insists on it), TLS 1.2 or 1.3 (apid's minimum is 1.2).
///
/// # Errors
/// A [`TlsMaterialError`] naming the field at fault.
pub fn client_tls(context: &TalosContext) -> Result<Arc<ClientConfig>, TlsMaterialError> {
    let certificates = |field: &'static str, pem: &str| {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| TlsMaterialError::Pem { field, source })
    };
    let mut roots = rustls::RootCertStore::empty();
    for ca in certificates("ca", &context.ca_pem)? {
        roots.add(ca).map_err(|e| TlsMaterialError::Roots(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsMaterialError::Roots("no certificate".to_owned()));
    }
    let chain = certificates("crt", &context.crt_pem)?;
    let key = PrivateKeyDer::from_pem_slice(context.key_pem.as_bytes())
        .map_err(|source| TlsMaterialError::Pem { field: "key", source })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsMaterialError::Identity)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(TlsMaterialError::Identity)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A connection to one apid endpoint, made whole within `bound` (a tower service, as tonic
/// takes a connector).
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) endpoint: Endpoint,
    pub(crate) tls: Arc<ClientConfig>,
    pub(crate) bound: Duration,
}

/// The connection a [`Connector`] makes.
pub(crate) type Connection = TokioIo<Prefixed<TlsStream<TcpStream>>>;

impl Service<Uri> for Connector {
    type Response = Connection;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Connection, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect())
    }
}

impl Connector {
    async fn connect(self) -> Result<Connection, ConnectError> {
        let bound = self.bound;
        let deadline = Instant::now() + bound;
        let timed_out = |step| ConnectError::TimedOut { step, bound };
        let host = self.endpoint.host.clone();
        let addrs: Vec<SocketAddr> = timeout_at(deadline, tokio::net::lookup_host((host.as_str(), self.endpoint.port)))
            .await
            .map_err(|_| timed_out("name resolution"))?
            .map_err(|source| ConnectError::Resolve { host: host.clone(), source })?
            .collect();
        let mut last = None;
        let mut tcp = None;
        for addr in addrs {
            match timeout_at(deadline, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    tcp = Some(stream);
                    break;
                }
                Ok(Err(source)) => last = Some(ConnectError::Tcp { addr, summary: summary(&source), source }),
                Err(_) => return Err(timed_out("TCP connect")),
            }
        }
        let Some(tcp) = tcp else {
            let source = io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address");
            return Err(last.unwrap_or(ConnectError::Resolve { host, source }));
        };
        tcp.set_nodelay(true).ok();
        let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL);
        socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive).ok();
        let server_name = ServerName::try_from(host.clone()).map_err(|e| ConnectError::Tls {
            source: io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} is not a server name: {e}")),
        })?;
        let mut tls = timeout_at(deadline, TlsConnector::from(self.tls).connect(server_name, tcp))
            .await
            .map_err(|_| timed_out("TLS handshake"))?
            .map_err(|source| ConnectError::Tls { source })?;
        // The server speaks first on HTTP/2 (its SETTINGS frame); with TLS 1.3 a refused
        // client certificate arrives here as an alert instead.
        let mut first = vec![0; 16 * 1024];
        let read = timeout_at(deadline, tls.read(&mut first))
            .await
            .map_err(|_| timed_out("the server's first HTTP/2 frame"))?;
        let n = match read {
            Ok(0) => return Err(ConnectError::Closed { source: None }),
            Ok(n) => n,
            Err(source) if is_tls_error(&source) => return Err(ConnectError::Tls { source }),
            Err(source) => return Err(ConnectError::Closed { source: Some(source) }),
        };
        first.truncate(n);
        Ok(TokioIo::new(Prefixed { prefix: first, offset: 0, inner: tls }))
    }
}

/// Whether an IO error carries a TLS error (tokio-rustls wraps rustls's in `InvalidData`).
fn is_tls_error(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
}

/// What a connect error means, in the words people search for.
fn summary(error: &io::Error) -> &'static str {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused",
        io::ErrorKind::TimedOut => "timed out",
        io::ErrorKind::HostUnreachable => "host unreachable",
        io::ErrorKind::NetworkUnreachable => "network unreachable",
        io::ErrorKind::AddrNotAvailable => "address not available",
        io::ErrorKind::PermissionDenied => "permission denied",
        io::ErrorKind::ConnectionReset => "connection reset",
        _ => "connect failed",
    }
}

/// A stream whose first bytes were already read: they are read again first.
pub(crate) struct Prefixed<S> {
    prefix: Vec<u8>,
    offset: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.offset < this.prefix.len() {
            let left = &this.prefix[this.offset..];
            let n = left.len().min(buf.remaining());
            buf.put_slice(&left[..n]);
            this.offset += n;
            if this.offset == this.prefix.len() {
                this.prefix = Vec::new();
                this.offset = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::Prefixed;

    #[tokio::test]
    async fn a_prefixed_stream_gives_back_what_was_read_first() {
        let rest: &[u8] = b" world";
        let mut stream = Prefixed { prefix: b"hello".to_vec(), offset: 0, inner: rest };
        let mut small = [0u8; 3];
        assert_eq!(stream.read(&mut small).await.unwrap(), 3);
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.unwrap();
        assert_eq!([&small[..], &all[..]].concat(), b"hello world");
    }
}
