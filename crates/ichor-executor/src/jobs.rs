//! Carrying out the jobs a [`Background`](crate::background::Background) queues: above
//! both the queue and the executors whose calls the jobs make, so that the queue (which
//! the executors submit to) depends on none of them.

use ichor_upgrade_core::status::MachineOutcome;

use crate::background::Job;
use crate::calls::Executor;
use crate::talos_api::PullRequest;

/// Carries a job out to its end: what a runner's task does with each job it takes.
pub async fn run_job(ex: &Executor<'_>, job: &Job) -> MachineOutcome {
    match job {
        Job::Install { machine, node, image, marker, operation, stop } => {
            let check = crate::effects::JobCheck { operation, node: node.as_deref(), stop };
            let launch = crate::machine::lifecycle::Launch::Job(&check);
            crate::machine::lifecycle::install(ex, machine, image.clone(), marker.clone(), launch)
                .await
                .unwrap_or_else(|e| e.outcome(ex.retry_at()))
        }
        Job::Prepull { machine, address, image } => {
            let pull = PullRequest { image: image.clone(), timeout: ex.config.step.upgrade_call };
            match crate::effects::pull(ex, address, &pull).await {
                Ok(_) => tracing::debug!(%machine, %image, "pre-pulled"),
                // Not a failure: the upgrade pulls again.
                Err(e) => tracing::info!(%machine, %image, error = %crate::cause::report(&e), "pre-pull failed"),
            }
            MachineOutcome::Progressed { action: "Prepull" }
        }
    }
}
