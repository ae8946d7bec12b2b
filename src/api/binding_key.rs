//! Which binding an object or a count belongs to: a ClusterBinding (`namespace: None`) or a
//! namespaced Binding. Every pass that reads bindings keys them this way.

/// Identifies a ClusterBinding (`namespace: None`) or a Binding.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BindingKey {
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for BindingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "Binding {ns}/{}", self.name),
            None => write!(f, "ClusterBinding {}", self.name),
        }
    }
}
