//! Who may found a cluster, and joins and merges refused for settings that differ.

use super::*;

fn setting(name: &str, value: &str) -> SharedSetting {
    SharedSetting {
        name: name.to_owned(),
        value: value.to_owned(),
    }
}

fn problems(g: &mut Gms) -> Vec<JoinProblem> {
    events(g)
        .into_iter()
        .filter_map(|e| match e {
            GmsEvent::JoinProblem(p) => Some(p),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lone_joiner_that_may_not_found_alone_reports_it_once_and_keeps_looking() {
    for founding in [Founding::WithOthers, Founding::Never] {
        let mut net = Net::new(1);
        net.nodes[0].as_mut().unwrap().set_founding(founding);
        start_all(&mut net);
        // `run_for` would spin for ever on a timer left in the past.
        net.run_for(Duration::from_secs(5));
        let g = net.nodes[0].as_mut().unwrap();
        assert_eq!(g.view(), None, "{founding:?}");
        assert_eq!(g.state(), MembershipState::Joining);
        assert_eq!(
            problems(g),
            vec![JoinProblem::NobodyAnswered],
            "{founding:?}"
        );
        assert!(g.poll_timeout().is_some_and(|t| t > net.now));
        assert_eq!(g.stats().founded, 0);
    }
}

#[test]
fn a_lone_joiner_may_found_alone_by_default() {
    let mut net = Net::new(1);
    start_all(&mut net);
    net.run_for(Duration::from_secs(2));
    assert_eq!(net.view(0).map(View::len), Some(1));
}

#[test]
fn joiners_that_hear_each_other_found_together_but_never_members_do_not() {
    let mut net = Net::new(3);
    for g in net.nodes.iter_mut().flatten() {
        g.set_founding(Founding::WithOthers);
    }
    start_all(&mut net);
    net.run_for(Duration::from_secs(3));
    net.assert_one_view_of(&[0, 1, 2]);

    let mut net = Net::new(2);
    for g in net.nodes.iter_mut().flatten() {
        g.set_founding(Founding::Never);
    }
    start_all(&mut net);
    net.run_for(Duration::from_secs(3));
    for i in 0..2 {
        assert_eq!(net.view(i), None);
        let g = net.nodes[i].as_mut().unwrap();
        // They heard each other: not alone, so nothing to report; they keep looking.
        assert_eq!(problems(g), vec![]);
        assert!(g.poll_timeout().is_some_and(|t| t > net.now));
    }
    // A member that may found appears: both join it.
    let mut founder = Gms::new(member(3), GmsConfig::local());
    founder.join(net.now);
    net.nodes.push(Some(founder));
    for row in &mut net.cut {
        row.push(false);
    }
    net.cut.push(vec![false; 3]);
    net.run_for(Duration::from_secs(3));
    net.assert_one_view_of(&[0, 1, 2]);
}

#[test]
fn a_joiner_whose_settings_differ_is_refused_and_never_founds() {
    let mut net = Net::new(2);
    let ours = vec![
        setting("partition_policy", "Available"),
        setting("lease", "1.2s"),
    ];
    let theirs = vec![
        setting("partition_policy", "Majority { cluster_size: 2 }"),
        setting("lease", "1.2s"),
    ];
    net.nodes[0].as_mut().unwrap().set_shared_settings(ours);
    net.nodes[1].as_mut().unwrap().set_shared_settings(theirs);
    let now = net.now;
    net.nodes[0].as_mut().unwrap().join(now);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.view(0).map(View::len), Some(1));
    // The joiner may found alone, but a refusal means a cluster exists that disagrees.
    let now = net.now;
    net.nodes[1].as_mut().unwrap().join(now);
    net.run_for(Duration::from_secs(5));
    assert_eq!(net.view(1), None);
    assert_eq!(net.view(0).map(View::len), Some(1));
    let refused = problems(net.nodes[1].as_mut().unwrap());
    assert!(!refused.is_empty());
    assert_eq!(
        refused[0],
        JoinProblem::SettingMismatch {
            coordinator: member(1),
            setting: "partition_policy".into(),
            coordinator_value: "Available".into(),
            joiner_value: "Majority { cluster_size: 2 }".into(),
        }
    );
    assert!(net.nodes[0].as_ref().unwrap().stats().joins_refused >= 1);
    assert_eq!(net.nodes[1].as_ref().unwrap().stats().founded, 0);
}

#[test]
fn a_setting_only_one_side_names_is_not_compared() {
    let mut net = Net::new(2);
    net.nodes[0]
        .as_mut()
        .unwrap()
        .set_shared_settings(vec![setting("lease", "1.2s"), setting("new", "x")]);
    net.nodes[1]
        .as_mut()
        .unwrap()
        .set_shared_settings(vec![setting("lease", "1.2s")]);
    start_all(&mut net);
    net.run_for(Duration::from_secs(3));
    net.assert_one_view_of(&[0, 1]);
}

#[test]
fn coordinators_whose_settings_differ_do_not_merge() {
    let mut net = Net::new(4);
    for (i, g) in net.nodes.iter_mut().flatten().enumerate() {
        let lease = if i < 2 { "1.2s" } else { "8s" };
        g.set_shared_settings(vec![setting("lease", lease)]);
    }
    net.partition(&[0, 1]);
    start_all(&mut net);
    net.run_for(Duration::from_secs(3));
    net.heal();
    net.run_for(Duration::from_secs(5));
    assert_eq!(net.view(0).map(View::len), Some(2));
    assert_eq!(net.view(2).map(View::len), Some(2));
    assert!(net.nodes[0].as_ref().unwrap().stats().merges_refused > 0);
}
