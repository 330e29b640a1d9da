// Reads a SARIF file with go-sarif (Go types generated from the SARIF 2.1.0 schema), rejecting
// any member the schema does not define, checks what code scanning needs of each result, and
// prints one line per result: `RULE LEVEL URI:LINE`.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/haya14busa/go-sarif/sarif"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	file, err := os.Open(os.Args[1])
	if err != nil {
		fail("%v", err)
	}
	decoder := json.NewDecoder(file)
	decoder.DisallowUnknownFields()
	var log sarif.Sarif
	if err := decoder.Decode(&log); err != nil {
		fail("not SARIF 2.1.0: %v", err)
	}
	if log.Version != sarif.The210 || len(log.Runs) != 1 {
		fail("want version 2.1.0 and one run")
	}
	run := log.Runs[0]
	rules := map[string]bool{}
	for _, rule := range run.Tool.Driver.Rules {
		rules[rule.ID] = true
	}
	if run.Tool.Driver.Name == "" {
		fail("the driver has no name")
	}
	for _, result := range run.Results {
		if result.RuleID == nil || !rules[*result.RuleID] {
			fail("a result's rule is not among the driver's rules")
		}
		if result.Message.Text == nil || *result.Message.Text == "" {
			fail("a result has no message")
		}
		level := "warning"
		if result.Level != nil {
			switch *result.Level {
			case sarif.Error, sarif.Warning, sarif.Note, sarif.None:
				level = string(*result.Level)
			default:
				fail("bad level %q", *result.Level)
			}
		}
		place := "-"
		for _, location := range result.Locations {
			physical := location.PhysicalLocation
			if physical == nil || physical.ArtifactLocation == nil || physical.ArtifactLocation.URI == nil {
				fail("a location without a file")
			}
			if physical.Region == nil || physical.Region.StartLine == nil || *physical.Region.StartLine < 1 {
				fail("a location without a line")
			}
			place = fmt.Sprintf("%s:%d", *physical.ArtifactLocation.URI, *physical.Region.StartLine)
		}
		fmt.Printf("%s %s %s\n", *result.RuleID, level, place)
	}
}
