package nodes

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// DefaultUnseenAfter is how long without a heartbeat makes a node
// "unseen": several heartbeat intervals, so one slow write is no alarm.
const DefaultUnseenAfter = 2 * time.Minute

// Diagnose fills in each node's Problems: a daemon that is down or has
// not been heard of for unseenAfter, a version other than the cluster's
// (version skew), BGP sessions that are not established, nodes a VXLAN
// node has no route to.
func Diagnose(list []Info, now time.Time, unseenAfter time.Duration) {
	skew := versionSkew(list)
	alive := 0
	for _, n := range list {
		if n.Alive {
			alive++
		}
	}
	for i := range list {
		n := &list[i]
		n.Problems = nil
		add := func(format string, args ...any) { n.Problems = append(n.Problems, fmt.Sprintf(format, args...)) }
		var ago time.Duration
		if n.LastSeen != nil {
			ago = now.Sub(*n.LastSeen).Round(time.Second)
		}
		switch {
		case !n.Alive && n.LastSeen != nil && ago >= unseenAfter:
			add("daemon down, unseen for %s (gone for good? `calico-cnm node delete %s`)", ago, n.Name)
		case !n.Alive && n.LastSeen != nil:
			add("daemon down (last seen %s ago)", ago)
		case !n.Alive:
			add("daemon down")
		case n.LastSeen != nil && ago >= unseenAfter:
			add("no heartbeat for %s (its daemon cannot write to the datastore?)", ago)
		}
		if why, ok := skew[n.Name]; ok {
			add("%s", why)
		}
		if r := n.Routing; n.Alive && r != nil {
			switch {
			case r.BGP && r.Peers == 0 && alive > 1:
				add("no BGP sessions")
			case r.BGP && r.Established < r.Peers:
				add("%d of %d BGP sessions not established", r.Peers-r.Established, r.Peers)
			}
			if len(r.Unreached) > 0 {
				add("no route to %s", strings.Join(r.Unreached, ", "))
			}
		}
	}
}

// versionSkew names, for each live node that runs another version than
// most live nodes, why it is flagged; with no majority version, every
// live node is.
func versionSkew(list []Info) map[string]string {
	count := map[string]int{}
	for _, n := range list {
		if n.Alive && n.Version != "" {
			count[n.Version]++
		}
	}
	if len(count) < 2 {
		return nil
	}
	versions := make([]string, 0, len(count))
	for v := range count {
		versions = append(versions, v)
	}
	sort.Slice(versions, func(i, j int) bool {
		if count[versions[i]] != count[versions[j]] {
			return count[versions[i]] > count[versions[j]]
		}
		return versions[i] < versions[j]
	})
	majority := versions[0]
	tie := count[versions[0]] == count[versions[1]]
	out := map[string]string{}
	for _, n := range list {
		if !n.Alive || n.Version == "" {
			continue
		}
		switch {
		case tie:
			out[n.Name] = fmt.Sprintf("version skew: the cluster runs %s", strings.Join(versions, ", "))
		case n.Version != majority:
			out[n.Name] = fmt.Sprintf("version skew: runs %s, most nodes run %s", n.Version, majority)
		}
	}
	return out
}
