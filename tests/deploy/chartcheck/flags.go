// The flags a pdserve binary really accepts, read from its --help (Abseil's format).
package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

type flagKind int

const (
	kindString flagKind = iota // quoted default
	kindList                   // unquoted, empty default (std::vector<std::string>)
	kindBool
	kindNumber
	kindDuration
	kindZero // default "0": a number or a duration (absl prints a zero duration as 0)
)

type flagInfo struct {
	name string
	def  string
	kind flagKind
}

// Flags every binary parsed by absl::ParseCommandLine takes but --help does not list.
var abslBuiltinFlags = map[string]bool{"flagfile": true, "fromenv": true, "tryfromenv": true,
	"undefok": true}

var (
	helpFlagLine = regexp.MustCompile(`(?m)^    --([A-Za-z0-9_]+) \(`)
	helpDefault  = regexp.MustCompile(`(?s)default: (.*?);\s*$`)
	durationRe   = regexp.MustCompile(`^-?([0-9]+(\.[0-9]*)?(ns|us|ms|s|m|h))+$`)
	numberRe     = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)
	integerRe    = regexp.MustCompile(`^-?[0-9]+$`)
)

// parseHelp reads Abseil's --help text: "    --name (description); default: value;" where the
// description may wrap onto lines indented by six spaces.
func parseHelp(text string) (map[string]flagInfo, error) {
	out := map[string]flagInfo{}
	locs := helpFlagLine.FindAllStringSubmatchIndex(text, -1)
	for i, loc := range locs {
		name := text[loc[2]:loc[3]]
		end := len(text)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		block := text[loc[0]:end]
		// The block of the last flag runs into the trailer ("Try --helpfull ..."): cut at the
		// first blank line.
		if j := strings.Index(block, "\n\n"); j >= 0 {
			block = block[:j]
		}
		m := helpDefault.FindStringSubmatch(strings.TrimRight(block, "\n"))
		if m == nil {
			return nil, fmt.Errorf("--help: no default for --%s", name)
		}
		out[name] = classify(name, m[1])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--help lists no flags")
	}
	return out, nil
}

func classify(name, def string) flagInfo {
	f := flagInfo{name: name, def: def}
	switch {
	case strings.HasPrefix(def, `"`):
		f.kind = kindString
	case def == "":
		f.kind = kindList
	case def == "true" || def == "false":
		f.kind = kindBool
	case def == "0":
		f.kind = kindZero
	case integerRe.MatchString(def) || numberRe.MatchString(def):
		f.kind = kindNumber
	case durationRe.MatchString(def) || def == "inf" || def == "-inf":
		f.kind = kindDuration
	default:
		f.kind = kindString
	}
	return f
}

// checkValue says why value does not fit the flag's type ("" when it does).
func checkValue(f flagInfo, value string) string {
	switch f.kind {
	case kindBool:
		if value != "true" && value != "false" && value != "1" && value != "0" {
			return fmt.Sprintf("expects true|false (default %s), got %q", f.def, value)
		}
	case kindNumber:
		if !numberRe.MatchString(value) {
			return fmt.Sprintf("expects a number (default %s), got %q", f.def, value)
		}
		// Abseil parses integer flags with SimpleAtoi: "4e+06" or "1.5" fail at startup.
		if integerRe.MatchString(f.def) && !isFloatFlagValue(f, value) && !integerRe.MatchString(value) {
			return fmt.Sprintf("expects an integer (default %s), got %q (a float64 value printed "+
				"by the template? use toJson or int64)", f.def, value)
		}
	case kindDuration:
		if !durationRe.MatchString(value) && value != "0" && value != "inf" {
			return fmt.Sprintf("expects a duration like 30s or 500ms (default %s), got %q", f.def, value)
		}
	case kindZero:
		if !numberRe.MatchString(value) && !durationRe.MatchString(value) {
			return fmt.Sprintf("expects a number or duration (default 0), got %q", value)
		}
	}
	return ""
}

// A flag whose integer-looking default belongs to a double (absl prints 1.0 as "1"): the help
// text cannot tell, so a decimal value is accepted there; exponent notation never is.
func isFloatFlagValue(f flagInfo, value string) bool {
	if strings.ContainsAny(value, "eE") {
		return false
	}
	_, err := strconv.ParseFloat(value, 64)
	return err == nil && strings.Contains(value, ".")
}

func readBinaryFlags(path string) (map[string]flagInfo, error) {
	out, err := exec.Command(path, "--help").CombinedOutput()
	text := string(out)
	if !strings.Contains(text, "Flags from") {
		return nil, fmt.Errorf("%s --help: unexpected output (err %v): %.200s", path, err, text)
	}
	return parseHelp(text)
}
