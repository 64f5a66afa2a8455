//! The house's rules that a compiler does not check (issue 54; `docs/architecture.md`,
//! "How the rules are checked"): no module circle in the workspace, and no function over
//! 120 lines in the core or the executor.
//!
//! Cargo already refuses a circle between crates; this test refuses one between the
//! modules of a crate. It reads each crate's sources with `syn`, from `src/lib.rs` (or
//! `src/main.rs`) along its `mod` declarations, and draws an edge from a module to every
//! module whose items it names: in a `use` (its `crate::`, `super::`, `self::` or child
//! paths) or in a path in its code. A `pub use` is a re-export, not a dependency: a path
//! through it is followed to where the item is defined. Test code (`#[cfg(test)]`) does
//! not count.
//!
//! The units are the public modules: a module declared `mod x;` (private) inside a folder
//! module is a part of that module (say `kubernetes_args/table.rs`, the table its parent
//! reads), and counts as it. The crate root's direct children are units whatever their
//! visibility. A circle among units fails the test, naming every edge of it and the file
//! that draws it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module's path from its crate's root (empty for the root).
type ModPath = Vec<String>;

/// One module read from a file.
#[derive(Debug)]
struct Module {
    file: PathBuf,
    /// Declared `pub` (any visibility), or a child of the root.
    unit: bool,
    /// Names this module re-exports (`pub use`), each to the absolute path it names.
    reexports: BTreeMap<String, ModPath>,
    /// Absolute paths this module names in its code and private `use`s.
    named: Vec<ModPath>,
    /// Each function of its non-test code (methods included), with its length in lines.
    functions: Vec<(String, usize)>,
}

/// Every module of the crate whose root file is `root`.
fn read_crate(root: &Path) -> BTreeMap<ModPath, Module> {
    let mut modules = BTreeMap::new();
    read_module(root, Vec::new(), true, &mut modules);
    modules
}

fn has_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                let tokens = l.tokens.to_string();
                tokens == "test" || tokens.starts_with("all (test") || tokens == "doctest"
            })
    })
}

fn read_module(file: &Path, path: ModPath, unit: bool, modules: &mut BTreeMap<ModPath, Module>) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    // Where this module's children live: beside a `mod.rs`/`lib.rs`/`main.rs`, else in a
    // folder named after the file.
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    let dir = if matches!(stem, "mod" | "lib" | "main") {
        file.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        file.with_extension("")
    };
    let mut children = Vec::new();
    for item in &ast.items {
        if let syn::Item::Mod(m) = item
            && m.content.is_none()
            && !has_cfg_test(&m.attrs)
        {
            let name = m.ident.to_string();
            let public = !matches!(m.vis, syn::Visibility::Inherited);
            children.push((name, public));
        }
    }
    let child_names: BTreeSet<String> = children.iter().map(|(n, _)| n.clone()).collect();
    let mut names = Names {
        here: path.clone(),
        children: child_names,
        reexports: BTreeMap::new(),
        named: Vec::new(),
        functions: Vec::new(),
    };
    names.visit_file(&ast);
    let module = Module {
        file: file.to_path_buf(),
        unit,
        reexports: names.reexports,
        named: names.named,
        functions: names.functions,
    };
    modules.insert(path.clone(), module);
    for (name, public) in children {
        let flat = dir.join(format!("{name}.rs"));
        let nested = dir.join(&name).join("mod.rs");
        let child_file = if flat.exists() { flat } else { nested };
        let mut child = path.clone();
        child.push(name);
        read_module(&child_file, child, public || path.is_empty(), modules);
    }
}

/// What one file names.
struct Names {
    here: ModPath,
    children: BTreeSet<String>,
    reexports: BTreeMap<String, ModPath>,
    named: Vec<ModPath>,
    functions: Vec<(String, usize)>,
}

/// How many lines `item` spans, its doc comment and attributes included.
fn lines_of(item: &impl syn::spanned::Spanned) -> usize {
    let span = item.span();
    span.end().line - span.start().line + 1
}

impl Names {
    /// `segments` as an absolute path, if it starts inside the crate.
    fn absolute(&self, segments: &[String]) -> Option<ModPath> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.clone(),
            "super" => {
                let mut base = self.here.clone();
                base.pop();
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                return Some(base);
            }
            name if self.children.contains(name) => {
                let mut base = self.here.clone();
                base.push(name.to_owned());
                base
            }
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, public: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, public);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.used(prefix, &n.ident.to_string(), &n.ident.to_string(), public),
            syn::UseTree::Rename(r) => self.used(prefix, &r.ident.to_string(), &r.rename.to_string(), public),
            syn::UseTree::Glob(_) => {
                if let Some(abs) = self.absolute(prefix) {
                    self.named.push(abs);
                }
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t, public);
                }
            }
        }
    }

    fn used(&mut self, prefix: &[String], name: &str, alias: &str, public: bool) {
        let mut segments = prefix.to_vec();
        if name != "self" {
            segments.push(name.to_owned());
        }
        let Some(abs) = self.absolute(&segments) else { return };
        if public {
            self.reexports.insert(alias.to_owned(), abs);
        } else {
            self.named.push(abs);
        }
    }
}

impl<'ast> Visit<'ast> for Names {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if has_cfg_test(&item.attrs) {
            return;
        }
        let public = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &item.tree, public);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if has_cfg_test(&item.attrs) {
            return;
        }
        syn::visit::visit_item_mod(self, item);
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if has_cfg_test(&item.attrs) {
            return;
        }
        self.functions.push((item.sig.ident.to_string(), lines_of(&item.sig) + lines_of(&item.block) - 1));
        syn::visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if has_cfg_test(&item.attrs) {
            return;
        }
        self.functions.push((item.sig.ident.to_string(), lines_of(&item.sig) + lines_of(&item.block) - 1));
        syn::visit::visit_impl_item_fn(self, item);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if has_cfg_test(&item.attrs) {
            return;
        }
        syn::visit::visit_item_impl(self, item);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            if let Some(abs) = self.absolute(&segments) {
                self.named.push(abs);
            }
        }
        syn::visit::visit_path(self, path);
    }
}

/// The module that defines what `path` names, through re-exports.
fn defining_module(modules: &BTreeMap<ModPath, Module>, path: &[String], depth: usize) -> ModPath {
    let mut n = path.len();
    while n > 0 && !modules.contains_key(&path[..n]) {
        n -= 1;
    }
    let module = &path[..n];
    if depth < 16
        && let Some(next) = path.get(n)
        && let Some(target) = modules.get(module).and_then(|m| m.reexports.get(next))
    {
        let mut through = target.clone();
        through.extend(path[n + 1..].iter().cloned());
        return defining_module(modules, &through, depth + 1);
    }
    module.to_vec()
}

/// The unit `path` counts as: itself if it is one, else its nearest ancestor that is.
fn unit_of(modules: &BTreeMap<ModPath, Module>, path: &[String]) -> ModPath {
    let mut path = path.to_vec();
    while !path.is_empty() && !modules.get(&path).is_some_and(|m| m.unit) {
        path.pop();
    }
    path
}

/// Edges between units, each with the files that draw it.
fn unit_edges(modules: &BTreeMap<ModPath, Module>) -> BTreeMap<ModPath, BTreeMap<ModPath, BTreeSet<PathBuf>>> {
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, BTreeSet<PathBuf>>> = BTreeMap::new();
    for (path, module) in modules {
        let from = unit_of(modules, path);
        for named in &module.named {
            let to = unit_of(modules, &defining_module(modules, named, 0));
            if to != from {
                edges.entry(from.clone()).or_default().entry(to).or_default().insert(module.file.clone());
            }
        }
    }
    edges
}

/// The strongly connected components of more than one unit (Tarjan).
fn circles(edges: &BTreeMap<ModPath, BTreeMap<ModPath, BTreeSet<PathBuf>>>) -> Vec<Vec<ModPath>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<ModPath, BTreeMap<ModPath, BTreeSet<PathBuf>>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on_stack: BTreeSet<ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    impl Tarjan<'_> {
        fn connect(&mut self, v: &ModPath) {
            let i = self.index.len();
            self.index.insert(v.clone(), i);
            self.low.insert(v.clone(), i);
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            let next: Vec<ModPath> = self.edges.get(v).map(|e| e.keys().cloned().collect()).unwrap_or_default();
            for w in &next {
                if !self.index.contains_key(w) {
                    self.connect(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v.clone(), low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v.clone(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(&w);
                    let done = &w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    let nodes: BTreeSet<ModPath> =
        edges.iter().flat_map(|(k, v)| std::iter::once(k.clone()).chain(v.keys().cloned())).collect();
    for v in &nodes {
        if !t.index.contains_key(v) {
            t.connect(v);
        }
    }
    t.found
}

fn name(path: &[String]) -> String {
    if path.is_empty() { "crate".to_owned() } else { path.join("::") }
}

/// The circles of the crate at `dir`, each described with the edges that close it.
fn crate_circles(dir: &Path) -> Vec<String> {
    let root = ["src/lib.rs", "src/main.rs"].iter().map(|f| dir.join(f)).find(|f| f.exists());
    let Some(root) = root else { return Vec::new() };
    let modules = read_crate(&root);
    let edges = unit_edges(&modules);
    circles(&edges)
        .into_iter()
        .map(|component| {
            let inside: BTreeSet<&ModPath> = component.iter().collect();
            let mut text =
                format!("{}: {}", dir.display(), component.iter().map(|p| name(p)).collect::<Vec<_>>().join(", "));
            for from in &component {
                for (to, files) in edges.get(from).into_iter().flatten() {
                    if inside.contains(to) {
                        let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
                        text.push_str(&format!("\n    {} -> {} ({})", name(from), name(to), files.join(", ")));
                    }
                }
            }
            text
        })
        .collect()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every crate of the workspace: its members' folders.
fn members() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("the workspace's manifest");
    let start = manifest.find("members = [").expect("a members list");
    let end = start + manifest[start..].find(']').expect("the list's end");
    manifest[start..end].split('"').skip(1).step_by(2).map(|member| workspace().join(member)).collect()
}

/// The crates whose functions are held to [`LONGEST_FUNCTION`] lines: the core and the
/// executor, where a function is read as the engine's logic.
const HELD_TO_LENGTH: [&str; 2] = ["crates/ichor-upgrade-core", "crates/ichor-executor"];

/// The longest a non-test function of those crates may be, from its signature to its
/// closing brace.
const LONGEST_FUNCTION: usize = 120;

#[test]
fn no_function_over_120_lines_in_the_core_or_the_executor() {
    let mut long = Vec::new();
    for dir in HELD_TO_LENGTH {
        let modules = read_crate(&workspace().join(dir).join("src/lib.rs"));
        assert!(modules.len() > 5, "{dir}: its modules were not read");
        for module in modules.values() {
            for (function, lines) in &module.functions {
                if *lines > LONGEST_FUNCTION {
                    long.push(format!("{}: {function}, {lines} lines", module.file.display()));
                }
            }
        }
    }
    assert!(long.is_empty(), "functions over {LONGEST_FUNCTION} lines:\n{}", long.join("\n"));
}

#[test]
fn no_module_circle_in_the_workspace() {
    let members = members();
    assert!(members.len() >= 10, "the workspace's members were not read: {members:?}");
    let found: Vec<String> = members.iter().flat_map(|m| crate_circles(m)).collect();
    assert!(found.is_empty(), "module circles:\n{}", found.join("\n"));
}

/// The Ichor crates each library crate may name in its `[dependencies]`
/// (`docs/architecture.md`, "The house's rules"); the examples, the benches and the
/// downstream suite, at the edge, may name any.
const MAY_DEPEND_ON: &[(&str, &[&str])] = &[
    ("ichor-upgrade-core", &[]),
    ("ichor-talosconfig", &[]),
    ("ichor-timeline", &[]),
    ("ichor-storage", &["ichor-upgrade-core"]),
    ("ichor-executor", &["ichor-upgrade-core", "ichor-storage"]),
    ("ichor-fuzz-checks", &["ichor-upgrade-core", "ichor-talosconfig"]),
    ("ichor-adapters", &["ichor-upgrade-core", "ichor-storage", "ichor-executor", "ichor-talosconfig"]),
    ("ichor-testkit", &["ichor-adapters"]),
    (
        "ichor-operator",
        &[
            "ichor-upgrade-core",
            "ichor-storage",
            "ichor-executor",
            "ichor-adapters",
            "ichor-talosconfig",
            "ichor-timeline",
        ],
    ),
    (
        "ichor-sim",
        &["ichor-upgrade-core", "ichor-storage", "ichor-executor", "ichor-adapters", "ichor-timeline", "ichor-testkit"],
    ),
];

/// The crates at the edge, which may depend on any.
const AT_THE_EDGE: [&str; 3] = ["ichor-examples", "ichor-benches", "ichor-downstream-tests"];

/// A manifest's package name and the Ichor crates in its `[dependencies]`.
fn ichor_dependencies(manifest: &str) -> (String, Vec<String>) {
    let mut name = String::new();
    let mut section = "";
    let mut found = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section == "[package]" && line.starts_with("name") {
            name = line.split('"').nth(1).unwrap_or_default().to_owned();
        }
        if section == "[dependencies]" && line.starts_with("ichor-") {
            let crate_name = line.split(|c: char| c == '=' || c == '.' || c.is_whitespace()).next().unwrap_or_default();
            found.push(crate_name.to_owned());
        }
    }
    (name, found)
}

#[test]
fn crates_depend_only_as_the_house_allows() {
    let mut wrong = Vec::new();
    let mut seen = Vec::new();
    for member in members() {
        let manifest = std::fs::read_to_string(member.join("Cargo.toml")).expect("a member's manifest");
        let (name, depends) = ichor_dependencies(&manifest);
        seen.push(name.clone());
        if AT_THE_EDGE.contains(&name.as_str()) {
            continue;
        }
        let allowed = MAY_DEPEND_ON.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
        let Some(allowed) = allowed else {
            wrong.push(format!("{name}: not in the house's table (docs/architecture.md)"));
            continue;
        };
        for dependency in depends.iter().filter(|d| !allowed.contains(&d.as_str())) {
            wrong.push(format!("{name} depends on {dependency}"));
        }
    }
    for (name, _) in MAY_DEPEND_ON {
        assert!(seen.iter().any(|s| s == name), "{name} is in the table but not a member: {seen:?}");
    }
    assert!(wrong.is_empty(), "against the house's rules:\n{}", wrong.join("\n"));
}

/// The manifest reader sees what a manifest says, and only in `[dependencies]`.
#[test]
fn a_manifests_ichor_dependencies_are_read_from_its_dependencies_alone() {
    let manifest = "[package]\nname = \"ichor-x\"\n\n[dependencies]\nichor-upgrade-core.workspace = true\n\
                    ichor-storage = { path = \"../s\" }\nserde = \"1\"\n\n[dev-dependencies]\nichor-testkit.workspace = true\n";
    assert_eq!(
        ichor_dependencies(manifest),
        ("ichor-x".to_owned(), vec!["ichor-upgrade-core".to_owned(), "ichor-storage".to_owned()])
    );
}

/// The checker sees a circle when there is one: two sibling modules naming each other,
/// one through its parent's re-export; and none when a private part names its parent.
#[test]
fn the_checker_finds_a_circle_and_only_a_circle() {
    let dir = std::env::temp_dir().join(format!("ichor-module-graph-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("family")).unwrap();
    let write = |f: &str, text: &str| std::fs::write(src.join(f), text).unwrap();
    write("lib.rs", "pub mod family;\npub mod other;\npub use other::Thing;\n");
    write("family/mod.rs", "pub mod a;\npub mod b;\nmod part;\npub use a::A;\n");
    write("family/a.rs", "pub struct A;\npub fn f() -> super::b::B { super::b::B }\n");
    write("family/b.rs", "pub struct B;\n");
    write("family/part.rs", "use super::A;\npub fn g(_: A) {}\n");
    write("other.rs", "pub struct Thing;\n#[cfg(test)]\nmod tests { use crate::family::A; }\n");
    assert_eq!(crate_circles(&dir), Vec::<String>::new());

    // b names A through `family`'s re-export: a circle a <-> b.
    write("family/b.rs", "pub struct B;\npub fn h() -> crate::family::A { crate::family::A }\n");
    let found = crate_circles(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("family::a -> family::b") && found[0].contains("family::b -> family::a"), "{found:?}");

    // A circle through the root's re-export, from a private use.
    write("family/b.rs", "pub struct B;\n");
    write("other.rs", "use crate::family::a::f;\npub struct Thing;\n");
    write("family/a.rs", "pub struct A;\npub fn f() -> crate::Thing { crate::Thing }\n");
    let found = crate_circles(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("family::a, other"), "{found:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A function's length is counted from its signature to its closing brace, its test
/// code aside.
#[test]
fn a_long_function_is_measured_and_test_code_is_not() {
    let dir = std::env::temp_dir().join(format!("ichor-function-length-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let body = |n: usize| (0..n).map(|i| format!("    let _x{i} = {i};\n")).collect::<String>();
    let text = format!(
        "pub fn short() {{\n{}}}\n\npub struct S;\n\nimpl S {{\n    pub fn long(&self) {{\n{}    }}\n}}\n\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}}}\n}}\n",
        body(10),
        body(121),
        body(200)
    );
    std::fs::write(dir.join("src/lib.rs"), text).unwrap();
    let modules = read_crate(&dir.join("src/lib.rs"));
    let functions = &modules[&Vec::new()].functions;
    assert_eq!(functions, &[("short".to_owned(), 12), ("long".to_owned(), 123)]);
    std::fs::remove_dir_all(&dir).unwrap();
}
