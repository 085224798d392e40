//! `emulate:` settings of links and hosts (see `topologies/README.md`).

use inc_link_spec::Impairments;

use super::Validator;
use crate::raw::S;

impl Validator<'_> {
    /// The impairments of the two directions of a link: `both` (`emulate:`), refined per
    /// direction by the named keys. `None` for a direction nothing is set for. A bad
    /// spec is reported at its key and that direction left unimpaired.
    pub(super) fn emulation(
        &mut self,
        el: &str,
        both: &Option<S<String>>,
        dirs: [(&str, &Option<S<String>>); 2],
    ) -> [Option<Impairments>; 2] {
        let base = both.as_ref().and_then(|s| {
            s.parse::<Impairments>().map_err(|e| self.issue(s, el, format!("emulate: {e}"))).ok()
        });
        if both.is_some() && base.is_none() {
            return [None, None];
        }
        dirs.map(|(key, dir)| {
            let Some(dir) = dir else { return base.clone() };
            let mut imp = base.clone().unwrap_or_default();
            match imp.apply(dir) {
                Ok(()) => Some(imp),
                Err(e) => {
                    self.issue(dir, el, format!("{key}: {e}"));
                    None
                }
            }
        })
    }
}
