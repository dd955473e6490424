package routing

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

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

// runAgentToSession runs an agent for node a over records and blocks
// until it has a session to b, and returns what its Run returns.
func runAgentToSession(t *testing.T, ctx context.Context, store *datastore.Store, records datastore.Records, blocks BlockSource, log logrus.FieldLogger) <-chan error {
	t.Helper()
	sp := newFakeSpeaker()
	agent, err := NewAgent(Deps{
		Store: store, Records: records, Blocks: blocks, Speaker: sp,
		Routes: &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}, NodeName: "a", Log: log,
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
	return done
}

// TestAgentRunReturnsItsFailure: when the stream of the node's blocks ends
// while the agent runs, the agent can no longer follow them: Run returns
// that failure (for the daemon's supervisor) instead of going on unseen.
func TestAgentRunReturnsItsFailure(t *testing.T) {
	store, eng, ctx, cancel, log, _ := newAgentFixtureWithPeer(t)
	defer cancel()
	blocks := closingBlocks{Engine: eng, events: make(chan ipam.BlockEvent)}
	done := runAgentToSession(t, ctx, store, syncedRecords(t, store), blocks, log)
	// The stream is read only by the running agent: once it takes an event
	// the agent is in its loop.
	_, block, _ := net.ParseCIDR("192.168.0.0/26")
	blocks.events <- ipam.BlockEvent{Block: *block, Host: "a", Added: true}
	close(blocks.events)
	followtest.ExpectReturn(t, done, ipam.ErrHostBlocksEnded, "Run went on after the block stream ended (its failure unseen)")
}

// TestAgentRunReturnsFollowFailure: when the agent can no longer follow
// the datastore (its syncer stopped), Run returns that failure instead of
// going on while it hears of no change.
func TestAgentRunReturnsFollowFailure(t *testing.T) {
	store, eng, ctx, cancel, log, _ := newAgentFixtureWithPeer(t)
	defer cancel()
	records, stop := followtest.Stoppable(t, store)
	done := runAgentToSession(t, ctx, store, records, eng, log)
	stop()
	followtest.ExpectReturn(t, done, datastore.ErrSyncerStopped, "Run went on while it follows the datastore no more")
}
