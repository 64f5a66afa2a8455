//! The admin kubeconfig on the wire: `MachineService.Kubeconfig` answers a `.tar.gz`
//! holding one regular file, `kubeconfig` (as Talos's `Copy` does), which `talosctl
//! kubeconfig` unpacks. Read here for the client, written for the server in front of the
//! simulated fleet. Nothing here touches a disk: the kubeconfig stays in memory.

use std::io::Read;

/// The `kubeconfig` file of an archive as the node sends it.
///
/// # Errors
/// Not gzip, not tar, or with no regular file `kubeconfig` (named).
pub fn unpack(archive: &[u8]) -> Result<Vec<u8>, String> {
    let mut entries = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    for entry in entries.entries().map_err(|e| format!("not a .tar.gz: {e}"))? {
        let mut entry = entry.map_err(|e| format!("not a .tar.gz: {e}"))?;
        let is_it = entry.header().entry_type().is_file()
            && entry.path().is_ok_and(|p| p.as_os_str() == "kubeconfig" || p.as_os_str() == "./kubeconfig");
        if is_it {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(|e| format!("reading kubeconfig from the archive: {e}"))?;
            return Ok(bytes);
        }
    }
    Err("the archive holds no file named kubeconfig".to_owned())
}

/// An archive holding `kubeconfig` as one regular file (mode 0600), as Talos sends it.
///
/// # Errors
/// Never in practice (writing to memory); an IO error from the encoders otherwise.
pub fn pack(kubeconfig: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(kubeconfig.len() as u64);
    header.set_mode(0o600);
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default()));
    builder.append_data(&mut header, "kubeconfig", kubeconfig)?;
    builder.into_inner()?.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_goes_into_an_archive_and_back_and_anything_else_is_refused_named() {
        let yaml = b"apiVersion: v1\nkind: Config\nclusters: []\n";
        assert_eq!(unpack(&pack(yaml).unwrap()).unwrap(), yaml);
        assert!(unpack(b"plain text").unwrap_err().contains("not a .tar.gz"));
        // A well-formed archive without the file.
        let mut header = tar::Header::new_gnu();
        header.set_size(2);
        header.set_mode(0o600);
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        builder.append_data(&mut header, "other", &b"hi"[..]).unwrap();
        let other = builder.into_inner().unwrap().finish().unwrap();
        assert_eq!(unpack(&other).unwrap_err(), "the archive holds no file named kubeconfig");
    }
}
