//! Talos and Kubernetes version parsing: never a panic; whatever parses displays back to
//! a text that parses to the same version; the path rule never panics on parsed pairs.
#![no_main]

use ichor_upgrade_core::versions::{KubernetesVersion, TalosVersion, check_kubernetes_pairing, check_upgrade_path};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (left, right) = text.split_once('\n').unwrap_or((text, text));
    let spec = TalosVersion::parse(left);
    let image = TalosVersion::from_os_image(left);
    if let Ok(v) = &spec {
        assert_eq!(TalosVersion::parse(&v.to_string()).as_ref(), Ok(v));
        assert_eq!(TalosVersion::from_os_image(&v.os_image()).as_ref(), Ok(v));
    }
    if let Ok(v) = &image {
        assert_eq!(TalosVersion::from_os_image(&v.os_image()).as_ref(), Ok(v));
    }
    if let Ok(k) = KubernetesVersion::parse(right) {
        assert_eq!(KubernetesVersion::parse(&k.to_string()).as_ref(), Ok(&k));
        if let Ok(v) = &spec {
            let _ = check_kubernetes_pairing(v, &k);
        }
    }
    if let (Ok(from), Ok(to)) = (spec, TalosVersion::parse(right)) {
        let _ = check_upgrade_path(&from, &to);
    }
});
