package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

func (a *app) datastoreCmd() *cobra.Command {
	return group("datastore", "Back up and restore the datastore, show its format and cluster identity",
		`  calico-cnm datastore info
  calico-cnm datastore backup /root/calico-cnm-backup.json
  calico-cnm datastore restore /root/calico-cnm-backup.json`,
		a.datastoreInfoCmd(), a.datastoreBackupCmd(), a.datastoreRestoreCmd())
}

func oneFileArg(what string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usagef("%s needs exactly one FILE (- for %s)", cmdName(c), what)
		}
		return nil
	}
}

// datastoreInfo is what `datastore info` prints.
type datastoreInfo struct {
	Prefix    string
	Format    int
	Supported int    // the newest format this calico-cnm reads
	Recorded  bool   // a format record exists (false: data older than format records)
	ClusterID string `json:",omitempty"`
	WrittenBy string `json:",omitempty"`
	// Restore is set while a restore holds new assignments back.
	Restore *datastore.RestoreHold `json:",omitempty"`
}

func (a *app) datastoreInfoCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "info",
		Short: "Show the datastore's format version and cluster identity",
		Long: `info shows the datastore's format version (the layout of its records), the
newest format this calico-cnm reads, and the cluster identity a backup
carries. It works on a newer format too: that is how to find out.`,
		Example: "  calico-cnm datastore info\n  calico-cnm datastore info -o json",
		Args:    noArgs,
	}
	out := addOutputFlag(c)
	c.RunE = func(c *cobra.Command, _ []string) error {
		store, err := a.openStore(c.Context())
		if err != nil {
			return err
		}
		defer store.Close()
		f, rev, err := store.ReadFormat(c.Context())
		if err != nil {
			return err
		}
		info := datastoreInfo{Prefix: store.Prefix(), Format: f.Version, Supported: datastore.CurrentFormat, Recorded: rev != 0, ClusterID: f.ClusterID, WrittenBy: f.WrittenBy}
		if f.Restore.Holding(time.Now()) {
			info.Restore = f.Restore
		}
		return out.print(a.stdout, info, func(w io.Writer) error {
			fmt.Fprintf(w, "prefix:      %s\nformat:      %d (this calico-cnm reads up to %d)\ncluster id:  %s\nwritten by:  %s\n",
				info.Prefix, info.Format, info.Supported, orDash(info.ClusterID), orDash(info.WrittenBy))
			if info.Restore != nil {
				fmt.Fprintf(w, "restore:     new addresses held back: %s (at most until %s)\n",
					info.Restore, info.Restore.Since.Add(datastore.RestoreHoldMax).Format(time.RFC3339))
			}
			if !info.Recorded {
				fmt.Fprintln(w, "(no format record yet: no daemon of this version has started on it)")
			}
			if err := datastore.CheckFormatVersion("the datastore", f); err != nil {
				fmt.Fprintln(w, err)
			}
			return nil
		})
	}
	return c
}

func (a *app) datastoreBackupCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "backup FILE",
		Short: "Export every calico-cnm record to FILE (- for stdout), daemons running",
		Long: `backup reads every record under the key prefix at one etcd revision and
writes them, with the datastore's format version and cluster identity, as
JSON to FILE (mode 0600: BGP passwords may be among the records). The
daemons' liveness keys are left out. It works the same on the embedded
member and on an external cluster, while everything runs.`,
		Example: "  calico-cnm datastore backup /root/calico-cnm-backup.json\n  calico-cnm datastore backup - | gzip > backup.json.gz",
		Args:    oneFileArg("stdout"),
	}
	c.RunE = func(c *cobra.Command, args []string) error {
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			b, err := store.Export(c.Context())
			if err != nil {
				return err
			}
			if err := writeBackup(args[0], a.stdout, b); err != nil {
				return err
			}
			if args[0] != "-" {
				fmt.Fprintf(a.stdout, "backed up %d records of cluster %s (format %d, etcd revision %d) to %s\n",
					len(b.Records), orDash(b.Format.ClusterID), b.Format.Version, b.Revision, args[0])
			}
			return nil
		})
	}
	return c
}

// writeBackup writes b to path ("-": stdout) through a temporary file,
// so that a failed backup never leaves a truncated file under its name.
func writeBackup(path string, stdout io.Writer, b datastore.Backup) error {
	if path == "-" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(b)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("creating the backup file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	enc := json.NewEncoder(tmp)
	enc.SetIndent("", "  ")
	err = enc.Encode(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing the backup to %s: %w", path, err)
	}
	return nil
}

func (a *app) datastoreRestoreCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "restore FILE",
		Short: "Make the datastore's records those of a backup (- for stdin), daemons running",
		Long: `restore writes the records of FILE that differ from the datastore's, deletes
the records FILE does not have, then rewrites the format record. Liveness keys
stay: the running daemons hold them. Each daemon reconciles as soon as the
format record changes: live containers keep their addresses, and an address
a container took after the backup is assigned to it again (never handed out
twice). Until every node of the backup has reconciled (at most 2 minutes),
new addresses are held back: "datastore info" shows the nodes still awaited.
A restore that fits one etcd transaction is applied at once. It refuses a backup of another cluster, and a backup or datastore in
a format newer than this calico-cnm's.`,
		Example: "  calico-cnm datastore restore /root/calico-cnm-backup.json",
		Args:    oneFileArg("stdin"),
	}
	c.RunE = func(c *cobra.Command, args []string) error {
		var r io.Reader = os.Stdin
		if args[0] != "-" {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		b, err := datastore.ReadBackup(r, args[0])
		if err != nil {
			return err
		}
		return a.withStore(c.Context(), func(store *datastore.Store, _ *ipam.Engine) error {
			rep, err := store.Restore(c.Context(), b, Version)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "restored %s (taken %s) into cluster %s: %d records written, %d deleted, %d unchanged; format %d\n",
				args[0], b.Taken.Format("2006-01-02T15:04:05Z07:00"), rep.Format.ClusterID, rep.Written, rep.Deleted, rep.Unchanged, rep.Format.Version)
			if h := rep.Format.Restore; h.Holding(time.Now()) {
				fmt.Fprintf(a.stdout, "new addresses are held back until %s have reconciled (see calico-cnm datastore info)\n", strings.Join(h.Pending, ", "))
			}
			return nil
		})
	}
	return c
}
