//! The tests of the examples, run as processes, one module per file, in one test binary.

mod api_restart;
mod kubectl_audit;
mod kubectl_plugin;
mod operator_alerts;
mod operator_defaults;
mod operator_desired;
mod operator_e2e;
mod operator_example;
mod operator_gates;
mod operator_install;
mod operator_kwok;
mod operator_monitoring;
mod operator_notify;
mod operator_plan;
mod operator_trace;
mod operator_windows;
mod readme_figures;
mod rollout_example;
mod rollout_kubernetes;
mod rollout_plan;
mod support;
mod talos_example;
mod timeline_example;
