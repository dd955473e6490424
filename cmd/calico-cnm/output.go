package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Output formats of -o/--output.
const (
	formatTable = "table"
	formatWide  = "wide"
	formatJSON  = "json"
	formatYAML  = "yaml"
)

var outputFormats = []string{formatTable, formatWide, formatJSON, formatYAML}

// output is the -o/--output flag of a command that prints data. The value
// is checked while the command line is parsed, so a bad format is a usage
// error before anything is read or changed.
type output struct{ format string }

// addOutputFlag registers -o/--output (default table) on cmd, with shell
// completion of the format names.
func addOutputFlag(cmd *cobra.Command) *output {
	o := &output{format: formatTable}
	cmd.Flags().VarP(o, "output", "o", "output format: "+strings.Join(outputFormats, ", "))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
	return o
}

func (o *output) String() string { return o.format }
func (o *output) Type() string   { return "format" }
func (o *output) Set(s string) error {
	for _, f := range outputFormats {
		if s == f {
			o.format = s
			return nil
		}
	}
	return fmt.Errorf("use %s", strings.Join(outputFormats, ", "))
}

// structured: the format is json or yaml (data for programs).
func (o *output) structured() bool { return o.format == formatJSON || o.format == formatYAML }

// wide: the table has its extra columns.
func (o *output) wide() bool { return o.format == formatWide }

// print writes v as JSON or YAML; for table and wide it calls text instead.
func (o *output) print(w io.Writer, v any, text func(w io.Writer) error) error {
	switch o.format {
	case formatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case formatYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return text(w)
}

// column is one column of a listing: its header, its cell for an item, and
// whether it shows only with -o wide; wideValue, when set, is the cell in
// -o wide (a full ID where the table shortens it).
type column[T any] struct {
	header    string
	value     func(T) string
	wide      bool
	wideValue func(T) string
}

// printList prints items as a table of cols, or as a JSON/YAML list (an
// empty list, never null, when there is nothing).
func printList[T any](w io.Writer, o *output, items []T, cols []column[T]) error {
	if items == nil {
		items = []T{}
	}
	return o.print(w, items, func(w io.Writer) error {
		var header []string
		var shown []column[T]
		for _, c := range cols {
			if !c.wide || o.wide() {
				header = append(header, c.header)
				shown = append(shown, c)
			}
		}
		rows := make([][]string, 0, len(items))
		for _, it := range items {
			row := make([]string, len(shown))
			for i, c := range shown {
				if c.wideValue != nil && o.wide() {
					row[i] = c.wideValue(it)
				} else {
					row[i] = c.value(it)
				}
			}
			rows = append(rows, row)
		}
		return writeTable(w, header, rows)
	})
}

// writeTable aligns header and rows in columns two spaces apart.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
