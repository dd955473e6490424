package routing

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow/followtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// closingBlocks is the engine with a block stream the test ends.
type closingBlocks struct {
	*ipam.Engine
	events chan ipam.BlockEvent
}

func (b closingBlocks) WatchHostBlocks(_ context.Context, _ string) <-chan ipam.BlockEvent {
	return b.events
}

// TestAgentRunReturnsItsFailure: when the stream of the node's blocks ends
// while the agent runs, the agent can no longer follow them: Run returns
// that failure (for the daemon's supervisor) instead of going on unseen.
func TestAgentRunReturnsItsFailure(t *testing.T) {
	store, eng, ctx, cancel, log, _ := newAgentFixtureWithPeer(t)
	defer cancel()
	blocks := closingBlocks{Engine: eng, events: make(chan ipam.BlockEvent)}
	sp := newFakeSpeaker()
	agent, err := NewAgent(Deps{
		Store: store, Records: syncedRecords(t, store), Blocks: blocks, Speaker: sp, Routes: &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	// The agent is running once it has a session to b.
	eventually(t, "a session to b", func() error {
		peers, _ := sp.snapshot()
		if _, ok := peers[addr("10.0.0.2")]; !ok {
			return errors.New("no session to b yet")
		}
		return nil
	})
	// The stream is read only by the running agent: once it takes an event
	// the agent is in its loop.
	_, block, _ := net.ParseCIDR("192.168.0.0/26")
	blocks.events <- ipam.BlockEvent{Block: *block, Host: "a", Added: true}
	close(blocks.events)
	select {
	case err := <-done:
		if !errors.Is(err, ipam.ErrHostBlocksEnded) {
			t.Fatalf("Run = %v, want ErrHostBlocksEnded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on after the block stream ended (its failure unseen)")
	}
}

// TestAgentRunReturnsFollowFailure: when the agent can no longer follow
// the datastore (its syncer stopped), Run returns that failure instead of
// going on while it hears of no change.
func TestAgentRunReturnsFollowFailure(t *testing.T) {
	store, eng, ctx, cancel, log, _ := newAgentFixtureWithPeer(t)
	defer cancel()
	records, stop := followtest.Stoppable(t, store)
	sp := newFakeSpeaker()
	agent, err := NewAgent(Deps{
		Store: store, Records: records, Blocks: eng, Speaker: sp,
		Routes: &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	eventually(t, "a session to b", func() error {
		peers, _ := sp.snapshot()
		if _, ok := peers[addr("10.0.0.2")]; !ok {
			return errors.New("no session to b yet")
		}
		return nil
	})
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, datastore.ErrSyncerStopped) {
			t.Fatalf("Run = %v, want %v", err, datastore.ErrSyncerStopped)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on while it follows the datastore no more")
	}
}
