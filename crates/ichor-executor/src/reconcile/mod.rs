//! `reconcile`: one pass of one operation, in stages, a private module each. It observes
//! the operation, its cluster, the Lease and every machine (`observe`, `view`), asks the
//! rollout engine with the gates its decision needs gathered (`decide`, `gates`), carries
//! the decision out (the lock first, then resets, stops and machine steps: `act`), and
//! records what came of it (`record`, `write`; an upgrade's first Completed status with
//! the morning-after audit, `audit`). It holds no state between calls but a
//! cache ([`PassMemory`]): call it again at the returned time, or when something changes.

mod act;
mod audit;
mod decide;
mod gates;
mod memory;
mod observe;
mod observe_kubernetes;
mod outcome;
mod record;
mod view;
mod write;

use ichor_upgrade_core::rollout::{LockAction, RolloutInput};

pub use audit::audit_cluster;
pub use memory::PassMemory;
pub use outcome::{ReconcileError, ReconcileOutcome};
pub use write::FORBIDDEN_RECHECK;

use crate::calls::Executor;
use decide::DecideEnd;
use observe::Seen;

/// One pass of the operation `name`, with a memory of its own: it never sees another
/// holder's Lease unchanged for long, so it takes over only a Lease whose holder is gone
/// (use [`reconcile_with`] across passes for the rest).
///
/// # Errors
/// A [`ReconcileError`] when the operation, its cluster or its Lease could not be read or
/// written; nothing after the failed call was done.
pub async fn reconcile(ex: &Executor<'_>, name: &str) -> Result<ReconcileOutcome, ReconcileError> {
    reconcile_with(ex, name, &PassMemory::new()).await
}

/// One pass of the operation `name`, advancing only the machines `memory` does not show
/// unchanged and waiting (see [`PassMemory`]). Keep one memory per operation across passes.
///
/// # Errors
/// As [`reconcile`].
pub async fn reconcile_with(
    ex: &Executor<'_>,
    name: &str,
    memory: &PassMemory,
) -> Result<ReconcileOutcome, ReconcileError> {
    // A pass that did not end (this process's first, or one that failed midway) may have
    // asked for an evacuation it never recorded: the next one looks for such records.
    let recover = !memory.take_pass_ended();
    let outcome = reconcile_pass(ex, name, memory, recover).await;
    if outcome.is_ok() {
        memory.set_pass_ended();
    }
    outcome
}

/// One pass; `recover` after a pass that did not end (see `observe::recover_evacuations`).
async fn reconcile_pass(
    ex: &Executor<'_>,
    name: &str,
    memory: &PassMemory,
    recover: bool,
) -> Result<ReconcileOutcome, ReconcileError> {
    if let Some(background) = ex.background {
        background.begin_pass();
    }
    // Observe: the operation, its cluster, the Lease, every machine with its Node.
    let seen = match observe::observe(ex, name, memory, recover).await? {
        Seen::Observed(seen) => *seen,
        Seen::Gone => return Ok(ReconcileOutcome::gone()),
        Seen::NoCluster(op) => return write::refuse_for_missing_cluster(ex, name, &op).await,
        Seen::Forbidden(op, what) => return write::wait_forbidden(ex, name, &op, what).await,
    };
    let mut cache = memory.take_views();
    let shown = view::show(ex, &seen, &mut cache).await;
    let pass = shown.pass(ex, name, &seen, &cache.views);
    // Decide, with the gates the decision asks for gathered.
    let input = shown.input(ex, &seen, &cache.views);
    let mut decided = match decide::decide_pass(&pass, memory, &shown.view, input).await? {
        DecideEnd::Act(decided) => *decided,
        DecideEnd::Ended(outcome) => {
            memory.keep_views(cache);
            return Ok(outcome);
        }
    };
    // Act: the lock first; a pass that takes it records that alone.
    let (op, lease, decision) = (&seen.op, seen.lease.as_ref(), &decided.decision);
    write::write_lock(ex, &op.cluster, &op.identity, lease, decision, shown.now).await?;
    let outcome = if matches!(decision.lock, LockAction::Acquire { .. }) {
        record::record_lock_taken(&pass, &decided).await?
    } else {
        let input = RolloutInput { operation: decided.recorded_view.as_ref().unwrap_or(&shown.view), ..input };
        let acted = act::act(&pass, memory, &decided.decision, &mut decided.gathered, &input).await?;
        // Record: the status, the Events, when to look again.
        record::record_pass(&pass, memory, &decided, acted).await?
    };
    memory.keep_views(cache);
    Ok(outcome)
}
