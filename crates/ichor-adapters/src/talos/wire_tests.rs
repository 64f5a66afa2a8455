//! The hand-written proto subset encodes as Talos's does: each message's bytes checked
//! against the field numbers and types of `shared/reference/talos-facts.md` §1.3.

use prost::Message;

use super::proto::common::Metadata;
use super::proto::machine::{
    EtcdMember, EtcdMemberAlarm, EtcdMemberStatus, ResetRequest, Upgrade, UpgradeRequest, etcd_member_alarm::AlarmType,
};
use super::proto::resource::{GetRequest, MachineStatusSpec, NodenameSpec, machine_status_spec::Stage};

fn bytes(message: &impl Message) -> Vec<u8> {
    message.encode_to_vec()
}

#[test]
fn upgrade_request_carries_only_the_image_when_force_and_preserve_are_unset() {
    let request = UpgradeRequest { image: "img".into(), ..UpgradeRequest::default() };
    assert_eq!(bytes(&request), [0x0a, 3, b'i', b'm', b'g'], "field 1, length-delimited; nothing else on the wire");
    let forced = UpgradeRequest { force: true, preserve: true, ..UpgradeRequest::default() };
    assert_eq!(bytes(&forced), [0x10, 1, 0x20, 1], "preserve is field 2, force field 4");
}

#[test]
fn a_reply_error_is_metadata_field_2_inside_the_reply_field_1() {
    let reply =
        Upgrade { metadata: Some(Metadata { error: "boom".into(), ..Metadata::default() }), ..Upgrade::default() };
    assert_eq!(bytes(&reply), [0x0a, 6, 0x12, 4, b'b', b'o', b'o', b'm']);
}

#[test]
fn etcd_member_numbers_start_at_2() {
    let member = EtcdMember { id: 5, hostname: "cp-1".into(), is_learner: true, ..EtcdMember::default() };
    assert_eq!(bytes(&member), [0x10, 5, 0x1a, 4, b'c', b'p', b'-', b'1', 0x30, 1]);
}

#[test]
fn etcd_member_status_leader_errors_and_member_id() {
    let status = EtcdMemberStatus { leader: 7, errors: vec!["x".into()], member_id: 9, ..EtcdMemberStatus::default() };
    assert_eq!(bytes(&status), [0x20, 7, 0x42, 1, b'x', 0x50, 9]);
}

#[test]
fn etcd_alarms_and_reset() {
    let alarm = EtcdMemberAlarm { member_id: 3, alarm: AlarmType::Nospace as i32 };
    assert_eq!(bytes(&alarm), [0x08, 3, 0x10, 1]);
    assert_eq!(bytes(&ResetRequest { graceful: true, reboot: false }), [0x08, 1]);
}

#[test]
fn cosi_get_and_the_specs_ichor_reads() {
    let get = GetRequest { namespace: "k8s".into(), r#type: "N".into(), id: "nodename".into() };
    let mut expected = vec![0x0a, 3, b'k', b'8', b's', 0x12, 1, b'N', 0x1a, 8];
    expected.extend_from_slice(b"nodename");
    assert_eq!(bytes(&get), expected);
    let nodename = NodenameSpec { nodename: "cp-1".into(), ..NodenameSpec::default() };
    assert_eq!(bytes(&nodename), [0x0a, 4, b'c', b'p', b'-', b'1']);
    let status = MachineStatusSpec { stage: Stage::Upgrading as i32, status: None };
    assert_eq!(bytes(&status), [0x08, 8], "UPGRADING is 8");
    assert_eq!(MachineStatusSpec::decode(&[0x08, 4][..]).unwrap().stage(), Stage::Running);
}

#[test]
fn an_image_pull_names_the_system_namespace_and_its_reference_is_field_3() {
    use super::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace};
    use super::proto::machine::ImageServicePullRequest;
    let system =
        ContainerdInstance { driver: ContainerDriver::Cri as i32, namespace: ContainerdNamespace::NsSystem as i32 };
    assert_eq!(bytes(&system), [0x08, 1, 0x10, 1], "CRI is 1, NS_SYSTEM is 1");
    let pull = ImageServicePullRequest { containerd: Some(system), image_ref: "i".into() };
    assert_eq!(bytes(&pull), [0x0a, 4, 0x08, 1, 0x10, 1, 0x1a, 1, b'i'], "image_ref is field 3: no field 2");
}

#[test]
fn pull_replies_are_progress_field_2_then_the_name_field_1() {
    use super::proto::machine::image_service_pull_response::Response;
    use super::proto::machine::{
        ImageServicePullLayerProgress, ImageServicePullProgress, ImageServicePullResponse,
        image_service_pull_layer_progress::Status,
    };
    let name = ImageServicePullResponse { response: Some(Response::Name("n".into())) };
    assert_eq!(bytes(&name), [0x0a, 1, b'n']);
    let layer =
        ImageServicePullLayerProgress { status: Status::AlreadyExists as i32, offset: 5, total: 6, elapsed: None };
    assert_eq!(bytes(&layer), [0x08, 4, 0x18, 5, 0x20, 6], "ALREADY_EXISTS is 4; offset 3, total 4");
    let progress = ImageServicePullResponse {
        response: Some(Response::PullProgress(ImageServicePullProgress { layer_id: "l".into(), progress: None })),
    };
    assert_eq!(bytes(&progress), [0x12, 3, 0x0a, 1, b'l']);
}

#[test]
fn the_lifecycle_install_names_its_image_and_ends_with_an_exit_code_field_2() {
    use super::proto::machine::lifecycle_service_install_progress::Response;
    use super::proto::machine::{
        InstallArtifactsSource, LifecycleServiceInstallProgress, LifecycleServiceUpgradeRequest,
        LifecycleServiceUpgradeResponse,
    };
    let request = LifecycleServiceUpgradeRequest {
        containerd: None,
        source: Some(InstallArtifactsSource { image_name: "i".into() }),
    };
    assert_eq!(bytes(&request), [0x12, 3, 0x0a, 1, b'i'], "source is field 2, image_name field 1");
    let exit = LifecycleServiceUpgradeResponse {
        progress: Some(LifecycleServiceInstallProgress { response: Some(Response::ExitCode(7)) }),
    };
    assert_eq!(bytes(&exit), [0x0a, 2, 0x10, 7]);
    let line = LifecycleServiceUpgradeResponse {
        progress: Some(LifecycleServiceInstallProgress { response: Some(Response::Message("m".into())) }),
    };
    assert_eq!(bytes(&line), [0x0a, 3, 0x0a, 1, b'm']);
}

#[test]
fn a_read_is_its_path_field_1_and_a_reboot_its_mode() {
    use super::proto::machine::{ReadRequest, RebootRequest, reboot_request::Mode};
    assert_eq!(bytes(&ReadRequest { path: "p".into() }), [0x0a, 1, b'p']);
    assert_eq!(bytes(&RebootRequest { mode: Mode::Default as i32 }), Vec::<u8>::new(), "DEFAULT is 0");
    assert_eq!(bytes(&RebootRequest { mode: Mode::Powercycle as i32 }), [0x08, 1]);
}
