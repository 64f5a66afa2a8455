//! The [`Seal`] a write asks for, which only [`crate::effects`] makes (decision 0016). A
//! module of its own, below the seams that name it (`talos_api`, `kube_api`), so that they
//! depend on it and not on `effects`, which depends on them.

/// Proof that a write comes from [`crate::effects`]: what [`TalosApi::write`] and
/// [`KubeApi::write`] ask for. Only `effects` makes one, so no other module of the
/// executor, and no code outside it, can make a write through them (decision 0016). An
/// implementation of those traits takes the seal it is given, and a wrapper passes it on.
///
/// [`TalosApi::write`]: crate::talos_api::TalosApi::write
/// [`KubeApi::write`]: crate::kube_api::KubeApi::write
///
/// A wrapper that is given a seal passes it on, and that compiles:
///
/// ```
/// use ichor_executor::talos_api::TalosApi;
/// use ichor_executor::writes::{Seal, TalosWrite};
///
/// async fn reboot(talos: &dyn TalosApi, seal: Seal) {
///     let _ = talos.write("192.0.2.10", TalosWrite::Reboot, seal).await;
/// }
/// ```
///
/// Code outside `effects` that makes its own does not compile, however it tries (every
/// module of this crate but `effects` is outside it as these are):
///
/// ```compile_fail,E0423
/// use ichor_executor::talos_api::TalosApi;
/// use ichor_executor::writes::{Seal, TalosWrite};
///
/// async fn reboot(talos: &dyn TalosApi) {
///     let _ = talos.write("192.0.2.10", TalosWrite::Reboot, Seal(())).await;
/// }
/// ```
///
/// ```compile_fail,E0624
/// use ichor_executor::talos_api::TalosApi;
/// use ichor_executor::writes::{Seal, TalosWrite};
///
/// async fn reboot(talos: &dyn TalosApi) {
///     let _ = talos.write("192.0.2.10", TalosWrite::Reboot, Seal::new()).await;
/// }
/// ```
///
/// ```compile_fail,E0599
/// use ichor_executor::talos_api::TalosApi;
/// use ichor_executor::writes::{Seal, TalosWrite};
///
/// async fn reboot_twice(talos: &dyn TalosApi, seal: Seal) {
///     let _ = talos.write("192.0.2.10", TalosWrite::Reboot, seal.clone()).await;
///     let _ = talos.write("192.0.2.10", TalosWrite::Reboot, seal).await;
/// }
/// ```
#[derive(Debug)]
pub struct Seal(());

impl Seal {
    /// A seal, for one write of `effects`.
    pub(super) fn new() -> Self {
        Self(())
    }
}
