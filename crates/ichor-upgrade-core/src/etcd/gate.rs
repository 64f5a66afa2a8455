//! The engine's own etcd gate (DESIGN §3 rule 3), as a pure verdict over what every
//! control plane reported.
//!
//! Talos's pre-upgrade check refuses only a two-member cluster and looks at neither
//! learners nor alarms, so the engine decides itself, from what every control plane
//! reports: its member list (readable, the same on every node, one member per control
//! plane, no learner), its own member's status (answering, no errors, not a learner, one
//! leader agreed by all) and the cluster's alarms (none).

use std::collections::BTreeSet;

use crate::rollout::EtcdVerdict;

/// Whether an etcd member's name belongs to a node: Talos names members after the node's
/// short hostname, while the node name may be the full name (kubelet `registerWithFQDN`).
#[must_use]
pub fn member_of(member_name: &str, node_name: &str) -> bool {
    member_name == node_name || node_name.split('.').next() == Some(member_name)
}

/// One etcd member as a control plane lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// The member ID.
    pub id: u64,
    /// The member's name (the node's hostname).
    pub name: String,
    /// Whether it is a learner.
    pub is_learner: bool,
}

/// One member's status, as `EtcdStatus` on its node reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberStatus {
    /// The member's ID.
    pub member_id: u64,
    /// The leader it follows (0: none).
    pub leader: u64,
    /// Errors the member reports.
    pub errors: Vec<String>,
    /// Whether it is a learner.
    pub is_learner: bool,
}

/// An etcd alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alarm {
    /// The member it names.
    pub member_id: u64,
    /// `NOSPACE` (1), `CORRUPT` (2), or another code; `NONE` (0) is no alarm.
    pub kind: i32,
}

/// What one control plane reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneReport {
    /// The control plane's node name (its etcd member's name).
    pub node: String,
    /// Its member list, or why it could not be read.
    pub members: Result<Vec<Member>, String>,
    /// Its own member's status, or why it could not be read.
    pub status: Result<MemberStatus, String>,
    /// The alarms it reports (etcd alarms are cluster-wide), or why they could not be read.
    pub alarms: Result<Vec<Alarm>, String>,
}

/// The gate before a control plane reboots: [`health`], and not exactly two members (a
/// two-member cluster loses quorum when either member reboots, and Talos's own check is
/// not on every path). Otherwise [`EtcdVerdict::Unhealthy`] naming the first problem.
#[must_use]
pub fn verdict(reports: &[ControlPlaneReport]) -> EtcdVerdict {
    match health(reports) {
        EtcdVerdict::Healthy if reports.len() == 2 => EtcdVerdict::Unhealthy {
            reason: "a two-member etcd cluster loses quorum when either member reboots".to_owned(),
        },
        verdict => verdict,
    }
}

/// Whether etcd is healthy: every control plane answered, all lists agree, every control
/// plane has exactly one member, there is no other member and none is a learner, every
/// member reports no error and follows one agreed leader, and there is no alarm. This is
/// what a member's leaving needs (a two-member cluster may shrink to one: that costs no
/// quorum); a reboot needs [`verdict`]. Otherwise [`EtcdVerdict::Unhealthy`] naming the
/// first problem.
#[must_use]
pub fn health(reports: &[ControlPlaneReport]) -> EtcdVerdict {
    let unhealthy = |reason: String| EtcdVerdict::Unhealthy { reason };
    let Some(first) = reports.first() else {
        return unhealthy("no control plane to ask".to_owned());
    };
    let mut reference: Option<(&str, BTreeSet<&Member>)> = None;
    for report in reports {
        let members = match &report.members {
            Ok(members) => members.iter().collect::<BTreeSet<_>>(),
            Err(error) => return unhealthy(format!("{}: member list unreadable: {error}", report.node)),
        };
        match &reference {
            None => reference = Some((report.node.as_str(), members)),
            Some((node, seen)) if *seen != members => {
                return unhealthy(format!("member lists differ between {node} and {}", report.node));
            }
            Some(_) => {}
        }
    }
    let (_, members) = reference.unwrap_or((first.node.as_str(), BTreeSet::new()));
    if let Some(learner) = members.iter().find(|m| m.is_learner) {
        return unhealthy(format!("member {} ({:016x}) is a learner", learner.name, learner.id));
    }
    for report in reports {
        let count = members.iter().filter(|m| member_of(&m.name, &report.node)).count();
        if count != 1 {
            return unhealthy(format!("control plane {} has {count} etcd members, not one", report.node));
        }
    }
    if members.len() != reports.len() {
        return unhealthy(format!("{} etcd members for {} control planes", members.len(), reports.len()));
    }
    let mut leader: Option<(u64, &str)> = None;
    for report in reports {
        let status = match &report.status {
            Ok(status) => status,
            Err(error) => return unhealthy(format!("{}: status unreadable: {error}", report.node)),
        };
        if let Some(error) = status.errors.first() {
            return unhealthy(format!("{}: member reports an error: {error}", report.node));
        }
        if status.is_learner {
            return unhealthy(format!("{}: member is a learner", report.node));
        }
        if status.leader == 0 {
            return unhealthy(format!("{}: member has no leader", report.node));
        }
        match leader {
            None => leader = Some((status.leader, report.node.as_str())),
            Some((agreed, first)) if agreed != status.leader => {
                return unhealthy(format!(
                    "no agreed leader: {first} follows {agreed:016x}, {} follows {:016x}",
                    report.node, status.leader
                ));
            }
            Some(_) => {}
        }
        match &report.alarms {
            Ok(alarms) => {
                if let Some(alarm) = alarms.iter().find(|a| a.kind != 0) {
                    let kind = match alarm.kind {
                        1 => "NOSPACE".to_owned(),
                        2 => "CORRUPT".to_owned(),
                        other => format!("alarm {other}"),
                    };
                    return unhealthy(format!("{kind} alarm on member {:016x}", alarm.member_id));
                }
            }
            Err(error) => return unhealthy(format!("{}: alarms unreadable: {error}", report.node)),
        }
    }
    EtcdVerdict::Healthy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, name: &str) -> Member {
        Member { id, name: name.into(), is_learner: false }
    }

    fn report(node: &str, members: Vec<Member>) -> ControlPlaneReport {
        let id = members.iter().find(|m| m.name == node).map_or(0, |m| m.id);
        ControlPlaneReport {
            node: node.into(),
            members: Ok(members),
            status: Ok(MemberStatus { member_id: id, leader: 1, errors: vec![], is_learner: false }),
            alarms: Ok(vec![]),
        }
    }

    fn healthy_three() -> Vec<ControlPlaneReport> {
        let members = vec![member(1, "cp-1"), member(2, "cp-2"), member(3, "cp-3")];
        ["cp-1", "cp-2", "cp-3"].iter().map(|n| report(n, members.clone())).collect()
    }

    #[test]
    fn one_voting_member_per_control_plane_everywhere_is_healthy() {
        assert_eq!(verdict(&healthy_three()), EtcdVerdict::Healthy);
    }

    #[test]
    fn an_unreadable_list_fails_naming_the_node() {
        let mut reports = healthy_three();
        reports[1].members = Err("connection refused".into());
        assert_eq!(
            verdict(&reports),
            EtcdVerdict::Unhealthy { reason: "cp-2: member list unreadable: connection refused".into() }
        );
    }

    #[test]
    fn a_learner_fails() {
        let mut reports = healthy_three();
        for r in &mut reports {
            r.members.as_mut().unwrap()[2].is_learner = true;
        }
        let EtcdVerdict::Unhealthy { reason } = verdict(&reports) else { panic!() };
        assert!(reason.contains("cp-3") && reason.contains("learner"), "{reason}");
    }

    #[test]
    fn a_missing_or_extra_member_fails() {
        let two = vec![member(1, "cp-1"), member(2, "cp-2")];
        let reports: Vec<_> = ["cp-1", "cp-2", "cp-3"].iter().map(|n| report(n, two.clone())).collect();
        assert!(matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("cp-3 has 0")));
        let four = vec![member(1, "cp-1"), member(2, "cp-2"), member(3, "cp-3"), member(4, "old-cp")];
        let reports: Vec<_> = ["cp-1", "cp-2", "cp-3"].iter().map(|n| report(n, four.clone())).collect();
        assert!(
            matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("4 etcd members for 3"))
        );
    }

    #[test]
    fn lists_that_disagree_fail() {
        let mut reports = healthy_three();
        reports[2].members.as_mut().unwrap()[0].id = 99;
        assert!(matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("differ")));
    }

    #[test]
    fn members_are_matched_by_short_hostname() {
        assert!(member_of("cp-1", "cp-1"));
        assert!(member_of("cp-1", "cp-1.example.internal"));
        assert!(!member_of("cp-1", "cp-10"));
        assert!(!member_of("cp-1.example.internal", "cp-1"));
        let members = vec![member(1, "cp-1"), member(2, "cp-2"), member(3, "cp-3")];
        let reports: Vec<_> = ["cp-1.lan", "cp-2.lan", "cp-3.lan"].iter().map(|n| report(n, members.clone())).collect();
        assert_eq!(verdict(&reports), EtcdVerdict::Healthy);
    }

    #[test]
    fn two_members_fail_however_healthy_each_is() {
        let members = vec![member(1, "cp-1"), member(2, "cp-2")];
        let reports: Vec<_> = ["cp-1", "cp-2"].iter().map(|n| report(n, members.clone())).collect();
        assert!(
            matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("two-member") && reason.contains("quorum"))
        );
        let one: Vec<_> = ["cp-1"].iter().map(|n| report(n, vec![member(1, "cp-1")])).collect();
        assert_eq!(verdict(&one), EtcdVerdict::Healthy, "a single member has no quorum to lose to another");
        assert_eq!(health(&reports), EtcdVerdict::Healthy, "healthy enough for one member to leave");
    }

    #[test]
    fn a_member_with_errors_no_leader_or_a_disagreeing_leader_fails() {
        let mut reports = healthy_three();
        reports[0].status.as_mut().unwrap().errors.push("slow disk".into());
        assert!(
            matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("cp-1") && reason.contains("slow disk"))
        );
        let mut reports = healthy_three();
        reports[1].status.as_mut().unwrap().leader = 0;
        assert!(matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("no leader")));
        let mut reports = healthy_three();
        reports[2].status.as_mut().unwrap().leader = 2;
        assert!(matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("no agreed leader")));
        let mut reports = healthy_three();
        reports[1].status = Err("timeout".into());
        assert!(
            matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("cp-2: status unreadable"))
        );
    }

    #[test]
    fn any_alarm_fails() {
        let mut reports = healthy_three();
        reports[0].alarms = Ok(vec![Alarm { member_id: 3, kind: 1 }]);
        assert!(matches!(verdict(&reports), EtcdVerdict::Unhealthy { reason } if reason.contains("NOSPACE")));
        let mut reports = healthy_three();
        reports[0].alarms = Ok(vec![Alarm { member_id: 3, kind: 0 }]);
        assert_eq!(verdict(&reports), EtcdVerdict::Healthy, "NONE is no alarm");
        reports[2].alarms = Err("refused".into());
        assert!(matches!(verdict(&reports), EtcdVerdict::Unhealthy { .. }));
    }

    #[test]
    fn no_control_plane_is_not_healthy() {
        assert!(matches!(verdict(&[]), EtcdVerdict::Unhealthy { .. }));
    }
}
