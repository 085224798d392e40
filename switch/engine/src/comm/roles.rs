//! What this switch does for one collective, decided once every child's Start arrived.

use inc_protocol::coll;
use inc_wire::Primitive;

use super::mask::ChildMask;

/// The switch's part in one collective. Data flows "up" (children to the slot pool, then
/// on) and "down" (parent to children); delivery is what a receiver beyond this switch
/// has confirmed, which Reduce and Broadcast need before a sending rank may complete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Roles {
    /// Children whose contributions complete a chunk.
    pub(crate) contributors: ChildMask,
    /// A completed chunk goes to the parent ...
    pub(crate) up_to_parent: bool,
    /// ... and as data to these children.
    pub(crate) up_to_children: ChildMask,
    /// Data chunks expected from the parent.
    pub(crate) chunks_from_parent: u64,
    /// A chunk from the parent goes as data to these children.
    pub(crate) down_to_children: ChildMask,
    /// Delivery is the minimum of what these children confirm (a host: chunks it ACKed;
    /// a switch: its Progress up) ...
    pub(crate) delivery_from_children: ChildMask,
    /// ... and of the parent's Progress (a Broadcast going up here and down elsewhere).
    pub(crate) delivery_from_parent: bool,
    /// Children told the delivered count (Reduce non-root branches, the Broadcast root's
    /// branch).
    pub(crate) tell_delivery: ChildMask,
    /// The delivered count also goes to the parent.
    pub(crate) delivery_to_parent: bool,
    /// Progress messages from the parent are forwarded to these children.
    pub(crate) forward_parent_progress: ChildMask,
}

/// The shape of the tree as one collective sees it from this switch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    pub(crate) has_parent: bool,
    /// Ranks beyond the parent ...
    pub(crate) ranks_beyond_parent: u16,
    /// ... of these in the communicator.
    pub(crate) world: u16,
    pub(crate) children: ChildMask,
    /// For Reduce and Broadcast: the child towards the root rank, if the root is below.
    pub(crate) root_child: Option<usize>,
    /// ... and whether that child is the root host itself.
    pub(crate) root_child_is_host: bool,
    /// A ReduceScatter (a Reduce to every rank).
    pub(crate) scatter: bool,
}

impl View {
    fn parent_has_ranks(&self) -> bool {
        self.ranks_beyond_parent > 0
    }
}

/// The roles for a `primitive` of `chunks` chunks, or why the collective cannot run.
pub(crate) fn assign(primitive: Primitive, chunks: u64, view: View) -> Result<Roles, &'static str> {
    let all = view.children;
    let mut roles = Roles::default();
    match primitive {
        // Every branch sends the blocks of its ranks and receives everyone else's: a
        // position goes to every neighbour but the one it came from, in stream order
        // (which neighbour that is follows from the position: the data path routes it).
        Primitive::AllGather => {
            roles.contributors = all;
            roles.up_to_children = all;
            roles.up_to_parent = view.parent_has_ranks();
            if view.parent_has_ranks() {
                let beyond = u64::from(view.ranks_beyond_parent);
                roles.chunks_from_parent = coll::chunks_of_blocks(chunks, view.world, beyond);
                roles.down_to_children = all;
            }
        }
        Primitive::AllReduce => {
            roles.contributors = all;
            if view.has_parent {
                roles.up_to_parent = true;
                roles.chunks_from_parent = chunks;
                roles.down_to_children = all;
            } else {
                roles.up_to_children = all;
            }
        }
        // Aggregated as an AllReduce; each position's result goes only towards the rank
        // whose block it is (the data path narrows the children per position), and the
        // root's aggregated count comes down as Progress for the positions a rank does
        // not receive.
        Primitive::Reduce if view.scatter => {
            roles.contributors = all;
            if view.has_parent {
                roles.up_to_parent = true;
                let below = u64::from(view.world - view.ranks_beyond_parent);
                roles.chunks_from_parent = coll::chunks_of_blocks(chunks, view.world, below);
                roles.down_to_children = all;
                roles.forward_parent_progress = all;
            } else {
                roles.up_to_children = all;
                roles.tell_delivery = all;
            }
        }
        Primitive::Reduce => {
            roles.contributors = all;
            let root_side = view.root_child.map(ChildMask::single);
            match (view.has_parent, root_side) {
                (true, Some(root)) => {
                    roles.up_to_parent = true;
                    roles.chunks_from_parent = chunks;
                    roles.down_to_children = root;
                    roles.delivery_from_children = root;
                    roles.tell_delivery = all & !root;
                    roles.delivery_to_parent = true;
                }
                (true, None) => {
                    roles.up_to_parent = true;
                    roles.forward_parent_progress = all;
                }
                (false, Some(root)) => {
                    roles.up_to_children = root;
                    roles.delivery_from_children = root;
                    roles.tell_delivery = all & !root;
                }
                (false, None) => return Err("Reduce root is not below the tree root"),
            }
        }
        Primitive::Broadcast => match view.root_child {
            Some(root_child) => {
                let root = ChildMask::single(root_child);
                let others = all & !root;
                // A switch whose only ranks are behind the root's branch has nothing to do.
                let root_sends =
                    view.root_child_is_host || !others.is_empty() || view.parent_has_ranks();
                if root_sends {
                    roles.contributors = root;
                    roles.up_to_children = others;
                    roles.delivery_from_children = others;
                    roles.up_to_parent = view.parent_has_ranks();
                    roles.delivery_from_parent = view.parent_has_ranks();
                    roles.tell_delivery = root;
                }
            }
            None if view.has_parent => {
                roles.chunks_from_parent = chunks;
                roles.down_to_children = all;
                roles.delivery_from_children = all;
                roles.delivery_to_parent = true;
            }
            None => return Err("Broadcast root is not below the tree root"),
        },
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(has_parent: bool, children: usize, root_child: Option<usize>) -> View {
        View {
            has_parent,
            ranks_beyond_parent: if has_parent { 2 } else { 0 },
            world: children as u16 + if has_parent { 2 } else { 0 },
            children: ChildMask::first(children),
            root_child,
            root_child_is_host: true,
            scatter: false,
        }
    }

    #[test]
    fn allreduce_root_turns_chunks_around() {
        let r = assign(Primitive::AllReduce, 9, view(false, 3, None)).unwrap();
        assert_eq!(r.contributors, ChildMask::first(3));
        assert_eq!(r.up_to_children, ChildMask::first(3));
        assert!(!r.up_to_parent);
        assert_eq!(r.chunks_from_parent, 0);
        assert!(r.delivery_from_children.is_empty() && !r.delivery_to_parent);
    }

    #[test]
    fn allreduce_leaf_sends_up_and_relays_down() {
        let r = assign(Primitive::AllReduce, 9, view(true, 2, None)).unwrap();
        assert!(r.up_to_parent);
        assert!(r.up_to_children.is_empty());
        assert_eq!(r.chunks_from_parent, 9);
        assert_eq!(r.down_to_children, ChildMask::first(2));
    }

    #[test]
    fn reduce_roles_by_position_of_the_root() {
        // Root below a leaf: the result comes back down to it only, the other children
        // hear the root's delivery count, which also goes up.
        let r = assign(Primitive::Reduce, 5, view(true, 3, Some(1))).unwrap();
        assert_eq!(r.down_to_children, ChildMask::single(1));
        assert_eq!(r.delivery_from_children, ChildMask::single(1));
        assert_eq!(r.tell_delivery.iter().collect::<Vec<_>>(), vec![0, 2]);
        assert!(r.delivery_to_parent && r.up_to_parent);
        // Root elsewhere: send up, forward what the parent says about delivery.
        let r = assign(Primitive::Reduce, 5, view(true, 3, None)).unwrap();
        assert!(r.up_to_parent);
        assert_eq!(r.forward_parent_progress, ChildMask::first(3));
        assert_eq!(r.chunks_from_parent, 0);
        // At the tree root the result turns to the root's branch.
        let r = assign(Primitive::Reduce, 5, view(false, 2, Some(0))).unwrap();
        assert_eq!(r.up_to_children, ChildMask::single(0));
        assert_eq!(r.tell_delivery, ChildMask::single(1));
        assert!(assign(Primitive::Reduce, 5, view(false, 2, None)).is_err());
    }

    #[test]
    fn broadcast_roles() {
        // The root's leaf: the root's chunks go to its siblings and up.
        let r = assign(Primitive::Broadcast, 4, view(true, 2, Some(0))).unwrap();
        assert_eq!(r.contributors, ChildMask::single(0));
        assert_eq!(r.up_to_children, ChildMask::single(1));
        assert!(r.up_to_parent && r.delivery_from_parent);
        assert_eq!(r.tell_delivery, ChildMask::single(0));
        // Another leaf: everything comes from the parent.
        let r = assign(Primitive::Broadcast, 4, view(true, 2, None)).unwrap();
        assert_eq!(r.chunks_from_parent, 4);
        assert_eq!(r.down_to_children, ChildMask::first(2));
        assert!(r.delivery_to_parent);
        assert!(assign(Primitive::Broadcast, 4, view(false, 2, None)).is_err());
    }

    #[test]
    fn allgather_roles() {
        // A leaf of two hosts, two ranks beyond the parent, 3 chunks per block: the
        // parent sends the 6 chunks of the others' blocks, everything goes everywhere
        // else.
        let r = assign(Primitive::AllGather, 12, view(true, 2, None)).unwrap();
        assert_eq!(r.contributors, ChildMask::first(2));
        assert_eq!(r.up_to_children, ChildMask::first(2));
        assert!(r.up_to_parent);
        assert_eq!(r.chunks_from_parent, 6);
        assert_eq!(r.down_to_children, ChildMask::first(2));
        assert!(r.delivery_from_children.is_empty() && r.tell_delivery.is_empty());
        // The root: between its children only.
        let r = assign(Primitive::AllGather, 12, view(false, 4, None)).unwrap();
        assert!(!r.up_to_parent && r.chunks_from_parent == 0);
        assert_eq!(r.up_to_children, ChildMask::first(4));
    }

    #[test]
    fn reduce_scatter_roles() {
        // A leaf of two hosts, two ranks beyond the parent, 3 chunks per block: up as
        // an AllReduce, the 6 results for the ranks below from the parent, Progress
        // forwarded to both children.
        let v = View { scatter: true, ..view(true, 2, None) };
        let r = assign(Primitive::Reduce, 12, v).unwrap();
        assert_eq!(r.contributors, ChildMask::first(2));
        assert!(r.up_to_parent);
        assert_eq!(r.chunks_from_parent, 6);
        assert_eq!(r.forward_parent_progress, ChildMask::first(2));
        // The root: results down, its count told to every child.
        let v = View { scatter: true, ..view(false, 4, None) };
        let r = assign(Primitive::Reduce, 12, v).unwrap();
        assert_eq!(r.up_to_children, ChildMask::first(4));
        assert_eq!(r.tell_delivery, ChildMask::first(4));
        assert!(!r.up_to_parent);
    }

    #[test]
    fn broadcast_through_a_switch_with_nobody_else_is_idle() {
        // A lone child switch (not the host) leads to the root, and nobody else is here
        // or beyond the parent: this switch neither receives nor sends anything.
        let v = View {
            has_parent: true,
            ranks_beyond_parent: 0,
            world: 1,
            children: ChildMask::first(1),
            root_child: Some(0),
            root_child_is_host: false,
            scatter: false,
        };
        assert_eq!(assign(Primitive::Broadcast, 4, v).unwrap(), Roles::default());
        // The same with the root host itself attached: it still sends (and is told).
        let r = assign(Primitive::Broadcast, 4, View { root_child_is_host: true, ..v }).unwrap();
        assert_eq!(r.contributors, ChildMask::single(0));
        assert!(!r.up_to_parent);
    }
}
