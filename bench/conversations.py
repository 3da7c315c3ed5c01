"""Seeded long conversations with planted facts, and how a fact is recognised.

Pure: every choice comes from one ``random.Random``, so a seed names a conversation.
Filler is drawn from a few topic templates (travel, a software project, cooking, health
appointments): user messages ask and remark, assistant replies paraphrase, advise and ask
a follow-up. Facts of five kinds are planted at given depths; every value is stated only
where it was planted (and in the assistant's echo), so finding it in a context means the
memory kept it.

Two mixes of probes. ``classic``: the five kinds, asked with the statement's words (or,
``paraphrased``, without them). ``hard``, what a real user asks: the five kinds always
paraphrased, plus *multi-hop* probes (two statements far apart, "my sister lives in
Lyon" … "I'm visiting my sister next month": "Which city am I travelling to next
month?") and *temporal* ones (news told on one day of the conversation, asked as "what did
I tell you on Tuesday 5 March …?" or "when did I tell you about …?"). Messages carry times
spread over ``DAYS`` days in both mixes (a second ``Random``, so that the text of a
classic conversation is what it always was).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TypeVar

_T = TypeVar("_T")
KINDS = ("number", "name", "date", "preference", "constraint")
# The hard mix's own kinds, after the five; every kind a probe can be.
HARD_KINDS = ("multi-hop", "temporal")
PROBE_KINDS = (*KINDS, *HARD_KINDS)
MIXES = ("hard", "classic")
BUCKETS = ("early", "middle", "late")
# Message ~4, ~40, ~120, ~200 and ~280 of 320; fractions so that --length scales them.
DEFAULT_DEPTHS = (0.0125, 0.125, 0.375, 0.625, 0.875)
DAYS = 10  # a conversation's turns are spread evenly over this many days
MULTI_HOP_GAP = 0.5  # the second statement of a multi-hop pair, this far (of the length) on


# --- Filler: topic templates -----------------------------------------------------------


@dataclass(frozen=True)
class Topic:
    """Templates for one subject of small talk; ``{slot}`` picks from ``slots``."""

    name: str
    slots: dict[str, tuple[str, ...]]
    asks: tuple[tuple[str, str], ...]  # (user sentence, the gist the assistant paraphrases)
    remarks: tuple[str, ...]  # extra user sentences
    advice: tuple[str, ...]  # assistant sentences
    follow_ups: tuple[str, ...]  # assistant questions


# fmt: off
# (Kept compact: the formatter would put every phrase on a line of its own.)
TOPICS = (
    Topic(
        name="travel",
        slots={
            "city": ("Lisbon", "Krakow", "Valencia", "Ljubljana", "Porto", "Tallinn", "Ghent"),
            "activity": ("a food tour", "a day hike", "a boat trip", "the old town walk",
                         "a cooking class", "the big art museum"),
            "transport": ("the night train", "a rental car", "the regional bus", "a ferry"),
            "duration": ("three days", "a long weekend", "five nights", "a full week"),
        },
        asks=(
            ("I'm thinking about spending {duration} in {city} later this year.",
             "spending {duration} in {city}"),
            ("Would {transport} be a sensible way to get around near {city}?",
             "getting around {city} with {transport}"),
            ("My partner really wants to do {activity}, but I worry it takes a whole day.",
             "fitting {activity} into the trip"),
            ("How much cash should I carry in {city}, or do most places take cards?",
             "paying for things in {city}"),
            ("I keep going back and forth on whether to book the hotel now or wait.",
             "when to book the hotel"),
            ("Is a city pass in {city} worth it, or is that a tourist trap?",
             "whether a city pass pays off"),
        ),
        remarks=(
            "We land fairly late, so the first evening will be quiet.",
            "Last time we tried to see everything and came home exhausted.",
            "I'd like at least one slow morning with nothing planned.",
            "The weather forecast looks mixed, so indoor options would help.",
            "Packing light is a priority this time.",
        ),
        advice=(
            "{city} is fairly compact, so walking between most sights is realistic.",
            "Refundable rooms booked early usually give you flexibility for little extra.",
            "If you plan {activity}, mornings tend to be less crowded.",
            "Transport passes often pay for themselves after a handful of rides.",
            "Leaving one afternoon unplanned tends to make a trip feel less rushed.",
            "{transport} can be relaxing if you are not in a hurry.",
            "Travel insurance is worth checking before you pay for anything big.",
            "Markets and small bakeries are often the cheapest good food in {city}.",
            "Many museums have one free or cheaper evening a week.",
        ),
        follow_ups=(
            "Do you already know which neighbourhood you'd like to stay in?",
            "Are you travelling with anyone else this time?",
            "How flexible are your dates?",
            "Would you rather have a packed schedule or plenty of free time?",
        ),
    ),
    Topic(
        name="software",
        slots={
            "component": ("the billing service", "the search API", "the mobile client",
                          "the data pipeline", "the admin dashboard"),
            "tool": ("PostgreSQL", "Kafka", "GitHub Actions", "Terraform", "Grafana"),
            "problem": ("flaky integration tests", "slow cold starts", "a memory leak",
                        "timeouts under load", "a confusing deployment process"),
        },
        asks=(
            ("We're still fighting {problem} in {component}.", "{problem} in {component}"),
            ("I'm considering moving {component} onto {tool}, but the team is split.",
             "moving {component} onto {tool}"),
            ("The code review for {component} has been open for days and nobody has time.",
             "the stalled review of {component}"),
            ("Should we write more end-to-end tests or focus on unit tests first?",
             "where to put the testing effort"),
            ("Our sprint planning keeps running over because the backlog is a mess.",
             "the messy backlog"),
            ("Management wants a rough estimate for rewriting {component}.",
             "estimating a rewrite of {component}"),
        ),
        remarks=(
            "Half the team is new, so onboarding is eating a lot of time.",
            "We also promised a demo to the customer soon.",
            "Honestly the documentation is the weakest part right now.",
            "I'd like to avoid a big-bang migration if we can.",
            "The on-call rotation has been rough lately.",
        ),
        advice=(
            "With {problem}, it usually pays to reproduce it in isolation first.",
            "{tool} is a reasonable choice if someone on the team already knows it well.",
            "Small, frequent pull requests tend to get reviewed faster than big ones.",
            "A short written design note can save a lot of back-and-forth in review.",
            "Measuring before optimising keeps the discussion grounded.",
            "Feature flags let you ship {component} changes without a risky cutover.",
            "Writing the rollback plan first makes a migration much less scary.",
            "A dashboard in {tool} that everyone can see tends to settle arguments quickly.",
            "Pairing on the hardest part of {component} spreads the knowledge around.",
        ),
        follow_ups=(
            "How big is the team working on {component}?",
            "Do you have monitoring that shows where the time goes?",
            "What would a good outcome look like by the end of the sprint?",
            "Has anyone on the team used {tool} in production before?",
        ),
    ),
    Topic(
        name="cooking",
        slots={
            "dish": ("a lentil stew", "homemade focaccia", "a mushroom risotto",
                     "a green curry", "roasted vegetables", "banana bread"),
            "ingredient": ("smoked paprika", "fresh basil", "coconut milk", "chickpeas",
                           "lemon zest", "a sourdough starter"),
            "occasion": ("a dinner party", "weekday lunches", "a family birthday",
                         "meal prep for the week"),
        },
        asks=(
            ("I want to make {dish} for {occasion}.", "making {dish} for {occasion}"),
            ("Can I swap {ingredient} for something else in {dish}?",
             "replacing {ingredient} in {dish}"),
            ("My last attempt at {dish} came out bland, no idea why.",
             "why {dish} came out bland"),
            ("How far ahead can I prepare {dish} without it going soggy?",
             "preparing {dish} ahead"),
            ("I bought too much {ingredient} and need ideas to use it up.",
             "using up {ingredient}"),
        ),
        remarks=(
            "My oven runs a bit hot, so I usually lower the temperature.",
            "I only have one large pan, which limits things.",
            "Someone at the table doesn't like very spicy food.",
            "I'd like something that reheats well.",
            "The shops near me close early on weekends.",
        ),
        advice=(
            "Salt in stages and taste as you go; blandness is usually under-seasoning.",
            "{ingredient} keeps well in the freezer if you portion it first.",
            "{dish} often tastes better the next day once the flavours settle.",
            "A squeeze of acid at the end brightens most slow-cooked dishes.",
            "Toasting spices briefly in oil brings out much more flavour.",
            "Doing the chopping the evening before makes the day itself calmer.",
            "{dish} scales up well, so cooking a double batch costs little extra effort.",
            "A simple green salad balances a rich main course nicely.",
        ),
        follow_ups=(
            "How many people are you cooking for?",
            "Do you have a rough time limit for the cooking?",
            "Are there any ingredients you want to avoid?",
            "Would you like a step-by-step plan for the day?",
        ),
    ),
    Topic(
        name="health",
        slots={
            "routine": ("a morning stretch", "evening walks", "a physio routine",
                        "yoga twice a week"),
            "concern": ("a stiff neck", "poor sleep", "knee pain after running",
                        "seasonal allergies", "back pain from sitting"),
            "place": ("the clinic", "the GP practice", "the physio", "the pharmacy"),
        },
        asks=(
            ("I've had {concern} for a couple of weeks now.", "dealing with {concern}"),
            ("I'm trying to stick to {routine}, but I keep skipping it.",
             "sticking to {routine}"),
            ("Should I call {place} about {concern} or wait a bit longer?",
             "whether to call {place}"),
            ("What should I ask at {place} so the visit isn't wasted?",
             "preparing questions for {place}"),
            ("Does {routine} actually help with {concern}?", "{routine} for {concern}"),
        ),
        remarks=(
            "Work has been stressful, which probably doesn't help.",
            "I sit at a desk most of the day.",
            "I sleep better on weekends for some reason.",
            "I'd rather try simple changes before anything else.",
            "The waiting times lately have been long.",
        ),
        advice=(
            "A note of when you notice {concern} gives the doctor something concrete.",
            "Short, regular sessions are easier to keep up than long occasional ones.",
            "If things get worse or new symptoms appear, it's worth calling sooner.",
            "A consistent bedtime helps more than most people expect.",
            "Bringing a short list of questions makes appointments much more useful.",
            "Small changes, like a standing break every hour, add up over a few weeks.",
            "{routine} works best when it is tied to something you already do daily.",
            "Staying hydrated and getting daylight early in the day both help sleep.",
        ),
        follow_ups=(
            "Has anything made it better or worse recently?",
            "How is your sleep otherwise?",
            "Would a simple weekly plan help you stay on track?",
            "Have you mentioned this at {place} before?",
        ),
    ),
)
# fmt: on

OPENERS = (
    "So you're weighing {gist}.",
    "It sounds like {gist} is the main question right now.",
    "Okay, {gist}, let's think that through.",
    "That's a fair concern about {gist}.",
    "Good question about {gist}.",
    "Thanks for the context on {gist}.",
)
ANSWERS = (
    "Not sure yet, to be honest.",
    "Probably, yes.",
    "We haven't decided that.",
    "Good question, I'll have to check.",
    "Mostly, I think.",
)
LEADS = ("By the way, ", "Before I forget, ", "Oh, and ", "Quick note: ", "Unrelated, but ", "")
ACKS = ("Noted.", "Got it, thanks for telling me.", "Understood.", "Thanks, that's useful.")

# --- Facts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FactTemplate:
    """A kind of fact: what the user says, the probe, and how the value is drawn."""

    kind: str
    statement: str  # "{v}" is the value
    probe: str  # asks with the statement's own words
    paraphrase: str  # asks without them: harder for lexical recall
    echo: str  # the assistant's paraphrase
    value: Callable[[random.Random], str]  # draws the value
    changed: str = ""  # constraints: the later statement with the new value "{v}"
    unit: str = ""  # constraints: the value's unit, part of the expected answer


def _digits(n: int) -> Callable[[random.Random], str]:
    """A value of n digits, not starting with 0."""
    return lambda rng: str(rng.randint(10 ** (n - 1), 10**n - 1))


FIRST_NAMES = ("Ingrid", "Tomasz", "Amara", "Kenji", "Lucia", "Oskar", "Priya", "Mateus",
               "Signe", "Dmitri", "Aoife", "Rafael", "Yara", "Henrik", "Ines", "Kwame")  # fmt: skip
LAST_NAMES = ("Halvorsen", "Kowalczyk", "Okafor", "Takahashi", "Ferreira", "Lindqvist",
              "Raghavan", "Brennan", "Castellano", "Novak", "Achterberg", "Moreau",
              "Szabo", "Mwangi")  # fmt: skip
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")  # fmt: skip


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(MONTHS)}"


def _fixed(value: str) -> Callable[[random.Random], str]:
    return lambda rng: value


def _choice(values: Sequence[str]) -> Callable[[random.Random], str]:
    return lambda rng: rng.choice(values)


Draw = Callable[[random.Random], str]


def _t(
    kind: str, statement: str, probe: str, paraphrase: str, echo: str, value: Draw, **kw: str
) -> FactTemplate:
    return FactTemplate(kind, statement, probe, paraphrase, echo, value, **kw)


# Six templates per kind: a conversation uses each at most once, so that every probe has
# one right answer (at most six depths).
FACT_TEMPLATES: dict[str, tuple[FactTemplate, ...]] = {
    "number": (
        _t("number", "my booking reference is {v}", "What is my booking reference?",
           "What's the code I quote for my reservation?",
           "your booking reference is {v}", _digits(5)),
        _t("number", "the door code for the office building is {v}",
           "What is the door code for the office building?",
           "What digits do I punch in to get into work?", "the door code is {v}",
           _digits(4)),
        _t("number", "my insurance policy number is {v}", "What is my insurance policy number?",
           "Which reference identifies my cover if I need to make a claim?",
           "policy number {v}", _digits(7)),
        _t("number", "the order number for my new laptop is {v}",
           "What is the order number for my new laptop?",
           "What's the reference for the computer I bought online?",
           "laptop order {v}", _digits(6)),
        _t("number", "my library card number is {v}", "What is my library card number?",
           "Which digits do I give to borrow books?",
           "library card {v}", _digits(8)),
        _t("number", "the parcel tracking code I'm waiting on is {v}",
           "What is the tracking code of the parcel I'm waiting on?",
           "What code lets me follow the delivery I expect?", "tracking code {v}",
           _digits(9)),
    ),
    "name": (
        _t("name", "my manager's name is {v}", "What is my manager's name?",
           "Who do I report to at work?",
           "your manager is {v}", _name),
        _t("name", "my landlord is called {v}", "What is my landlord called?",
           "Who do I rent my flat from?",
           "your landlord is {v}", _name),
        _t("name", "the tech lead on the new project is {v}",
           "Who is the tech lead on the new project?",
           "Who heads engineering on the initiative we just started?",
           "{v} leads the tech side", _name),
        _t("name", "my physiotherapist is {v}", "Who is my physiotherapist?",
           "Who treats me at my rehab sessions?",
           "{v} is your physiotherapist", _name),
        _t("name", "the wedding planner my sister hired is {v}",
           "Who is the wedding planner my sister hired?",
           "Who is organising the big day for my sibling?", "the planner is {v}", _name),
        _t("name", "the neighbour who waters our plants is {v}",
           "Who waters our plants when we're away?",
           "Who looks after the greenery while we travel?", "{v} waters the plants", _name),
    ),
    "date": (
        _t("date", "my dentist appointment is on {v}", "When is my dentist appointment?",
           "When am I getting my teeth checked?",
           "the dentist on {v}", _date),
        _t("date", "the project deadline is {v}", "When is the project deadline?",
           "By when does the work have to be delivered?",
           "the deadline is {v}", _date),
        _t("date", "my passport expires on {v}", "When does my passport expire?",
           "Until when is my travel document valid?",
           "passport expiry on {v}", _date),
        _t("date", "my sister's wedding is on {v}", "When is my sister's wedding?",
           "When does my sibling get married?",
           "the wedding on {v}", _date),
        _t("date", "the lease renewal is due on {v}", "When is my lease renewal due?",
           "When do I have to extend my rental contract?",
           "lease renewal due {v}", _date),
        _t("date", "my flight home is on {v}", "When is my flight home?",
           "On what day do I travel back?",
           "your flight home on {v}", _date),
    ),
    "preference": (
        _t("preference", "I prefer {v} seats on planes", "Which kind of seat do I like on planes?",
           "Where do I like to sit when I travel by air?",
           "{v} seats for you", _fixed("aisle")),
        _t("preference", "I take my coffee with {v}", "How do I take my coffee?",
           "What do I add to my morning drink?",
           "coffee with {v}", _choice(("oat milk", "almond milk"))),
        _t("preference", "my favourite cuisine is {v}", "What is my favourite cuisine?",
           "Which kind of cooking do I enjoy most when eating out?",
           "you love {v} food", _choice(("Ethiopian", "Georgian", "Peruvian"))),
        _t("preference", "I like reminders by {v} rather than by phone call",
           "How do I like to get reminders?",
           "What's the best way to nudge me about things?", "reminders by {v}",
           _choice(("text message", "email"))),
        _t("preference", "I always use {v} in every editor", "Which colour theme do I use?",
           "What look do I choose for my code tools?",
           "{v} everywhere", _choice(("dark mode", "solarized light"))),
        _t("preference", "I prefer to pay by {v} whenever possible", "How do I prefer to pay?",
           "What's my usual method of settling bills?",
           "paying by {v}", _choice(("bank transfer", "cash"))),
    ),
    "constraint": (
        _t("constraint", "never schedule anything for me before {v}",
           "What is the earliest time anything can be scheduled for me now?",
           "From what hour am I available in the morning these days?",
           "nothing before {v}", _choice(("8", "9", "10", "11")),
           changed="actually, from now on nothing should be scheduled before {v}", unit="am"),
        _t("constraint", "keep the hotel under {v} a night",
           "What is my current hotel budget per night?",
           "How much can I spend on a room per night currently?", "hotels under {v} a night",
           _choice(tuple(str(x) for x in range(80, 260, 10))),
           changed="change of plan: the hotel can be up to {v} a night now", unit=" euros"),
        _t("constraint", "keep my meetings to {v} at most",
           "How long can my meetings be at most now?",
           "How long may a session with colleagues run these days?", "meetings of at most {v}",
           _choice(("15", "20", "25", "30", "45", "50", "60", "75", "90")),
           changed="update: my meetings can run up to {v} from now on", unit=" minutes"),
        _t("constraint", "my spending limit for gifts is {v}",
           "What is my spending limit for gifts now?",
           "How much may I spend on presents these days?", "gifts up to {v}",
           _choice(tuple(str(x) for x in range(20, 220, 10))),
           changed="I've changed my mind, the gift limit is now {v}", unit=" dollars"),
        _t("constraint", "the kids have to be in bed by {v}",
           "By what time do the kids have to be in bed now?",
           "When do the children need to sleep these days?", "bedtime at {v}",
           _choice(("7", "8", "9")), changed="new rule: the kids can stay up until {v}",
           unit="pm"),
        _t("constraint", "I can't do more than {v} of screen time a day",
           "How much screen time a day am I allowed now?",
           "How long may I spend on devices daily these days?", "at most {v} of screens",
           _choice(("2", "3", "4", "5", "6")),
           changed="from now on I allow myself {v} of screen time a day", unit=" hours"),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class MultiHopTemplate:
    """Two statements far apart; the probe needs both and names neither's value."""

    first: str  # states the value "{v}"
    second: str  # later: refers back to the first's subject, without the value
    link: str  # words of ``second`` that show it was forwarded (stated nowhere else)
    probe: str  # shares no rare word with ``first``
    echo: str  # the assistant's paraphrase of ``first``
    value: Draw


CITIES = ("Lyon", "Bergen", "Trieste", "Aarhus", "Bruges", "Salzburg")  # not filler cities

# fmt: off
MULTI_HOP_TEMPLATES = (
    MultiHopTemplate(
        "my sister lives in {v}",
        "I'm visiting my sister next month, I've already asked for the days off",
        "visiting my sister next month", "Which city am I travelling to next month?",
        "your sister lives in {v}", _choice(CITIES)),
    MultiHopTemplate(
        "my oldest friend works as a {v}",
        "my oldest friend is coming over for dinner on Friday",
        "coming over for dinner on Friday", "What does my guest on Friday evening do for a living?",
        "your oldest friend is a {v}",
        _choice(("vet", "pharmacist", "carpenter", "midwife", "translator"))),
    MultiHopTemplate(
        "our dog is called {v}",
        "the dog sitter cancelled, so the dog is coming to the office with me tomorrow",
        "coming to the office with me tomorrow",
        "What's the name of the animal joining me at work tomorrow?",
        "your dog is {v}", _choice(("Biscuit", "Pepper", "Mochi", "Juniper", "Waffles"))),
    MultiHopTemplate(
        "my brother is allergic to {v}",
        "my brother is joining us for the barbecue on Saturday",
        "joining us for the barbecue on Saturday",
        "Which food must I keep off the grill this weekend?",
        "no {v} for your brother", _choice(("peanuts", "shellfish", "sesame", "kiwi"))),
    MultiHopTemplate(
        "my mother's birthday is on {v}",
        "I want to book a table at a nice restaurant for my mother's birthday",
        "book a table at a nice restaurant",
        "For which day do I need the restaurant reservation?",
        "your mother's birthday on {v}", _date),
    MultiHopTemplate(
        "my cousin {v} is a lawyer",
        "I need legal advice about a dispute with a contractor",
        "legal advice about a dispute with a contractor",
        "Which relative could I ask about my disagreement with the builder?",
        "your cousin {v} is a lawyer", _name),
)
# fmt: on


@dataclass(frozen=True)
class TemporalTemplate:
    """News told on one day; asked by its day, or for its day, in other words."""

    statement: str  # "{v}" is the value
    what: str  # "{day}" is the day it was told ("Tuesday 5 March"): asks what was said
    when: str  # asks on which day it was told
    echo: str
    value: Draw


# fmt: off
TEMPORAL_TEMPLATES = (
    TemporalTemplate(
        "we adopted a kitten and named her {v}",
        "What did I tell you on {day} about a new member of the household?",
        "On which day did I tell you about the new member of our household?",
        "a kitten called {v}", _choice(("Miso", "Pickle", "Nori", "Clementine", "Tofu"))),
    TemporalTemplate(
        "I signed up for a {v} course at the community centre",
        "What did I tell you on {day} that I had enrolled in?",
        "When did I tell you I had enrolled in lessons?",
        "the {v} course",
        _choice(("pottery", "salsa", "woodworking", "calligraphy", "glassblowing"))),
    TemporalTemplate(
        "my car failed its inspection because of the {v}",
        "What did I tell you on {day} was wrong with my vehicle?",
        "When did I tell you about the problem with my vehicle?",
        "the {v} need fixing", _choice(("brake pads", "exhaust", "headlights", "tyres"))),
    TemporalTemplate(
        "I got a job offer from {v}",
        "Which employer did I tell you about on {day}?",
        "When did I tell you an employer wanted to hire me?",
        "the offer from {v}",
        _choice(("Nordlicht Labs", "Baobab Health", "Quillmark", "Tidewater Logistics"))),
    TemporalTemplate(
        "we reserved the {v} for our anniversary party",
        "Which place did I tell you on {day} we had booked for the celebration?",
        "When did I tell you where the celebration would be held?",
        "the party at the {v}",
        _choice(("Old Boathouse", "Villa Serena", "Glasshouse Loft", "Copper Kettle"))),
    TemporalTemplate(
        "I left my {v} on the tram this morning",
        "What did I tell you on {day} that I had lost on public transport?",
        "When did I tell you I had lost something on public transport?",
        "your {v} on the tram", _choice(("reading glasses", "blue scarf", "wallet", "umbrella"))),
)
# fmt: on


@dataclass(frozen=True)
class Fact:
    """A planted fact and its probe; ``index`` is the message that holds the answer."""

    kind: str
    probe: str
    expected: str
    index: int  # 0-based message index of the (newest) statement
    bucket: str
    depth: float  # the requested depth this fact was planted for
    old: str = ""  # constraints: the value that was changed (stale if only this is seen)
    old_index: int = -1
    link: str = ""  # multi-hop: words of the second statement, which must be forwarded too
    link_index: int = -1  # multi-hop: the second statement's message
    answer: str = ""  # what a right answer states, when not ``expected`` (temporal "when")

    @property
    def right_answer(self) -> str:
        """The value a model's answer must state."""
        return self.answer or self.expected


@dataclass(frozen=True)
class Conversation:
    """A generated conversation: OpenAI-style messages and the facts planted in them."""

    id: str
    messages: tuple[dict[str, str], ...]
    facts: tuple[Fact, ...]
    times: tuple[float, ...] = ()  # each message's time, Unix seconds


# --- Scoring ---------------------------------------------------------------------------


def _ordinal(day: str) -> str:
    """1 → 1st, 12 → 12th, 22 → 22nd."""
    n = int(day)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return day + suffix


def variants(expected: str) -> tuple[str, ...]:
    """Spellings that state the same value: "9am" is also "9 am"; "14 March" "March 14"."""
    out = [expected]
    hour = re.fullmatch(r"(\d+)(am|pm)", expected)
    if hour:
        h, half = hour.groups()
        out += [f"{h} {half}", f"{h}:00 {half}", f"{h}:00{half}", f"{h} {half[0]}.m."]
    date = re.fullmatch(r"(\d+) ([A-Z][a-z]+)", expected)
    if date:
        day, month = date.groups()
        nth = _ordinal(day)
        out += [f"{month} {day}", f"{nth} {month}", f"{month} {nth}", f"{nth} of {month}"]
    money = re.fullmatch(r"(\d+) (euros|dollars)", expected)
    if money:
        amount, unit = money.groups()
        sign, code = ("€", "EUR") if unit == "euros" else ("$", "USD")
        out += [f"{sign}{amount}", f"{amount} {code}", f"{code} {amount}", f"{amount}{sign}"]
    return tuple(out)


def mentions(text: str, expected: str) -> bool:
    """Whether the text states the value: case-insensitive, whole words only.

    Whole words, because a substring test would find "4 March" in "14 March", "9am" in
    "19am" and "2 hours" in "12 hours". Whitespace inside the value may vary.
    """
    for variant in variants(expected):
        pattern = r"\s+".join(re.escape(part) for part in variant.split())
        if re.search(rf"(?<![\w$€]){pattern}(?![\w])", text, re.IGNORECASE):
            return True
    return False


def bucket_of(index: int, length: int) -> str:
    """Early, middle or late third of the conversation."""
    return BUCKETS[min(2, 3 * index // length)]


# --- Generator (pure: everything comes from one seeded Random) --------------------------


def _fill(template: str, values: dict[str, str]) -> str:
    text = template.format(**values)
    return text[0].upper() + text[1:]


def _slot_values(rng: random.Random, topic: Topic) -> dict[str, str]:
    """One value per slot, so that a message and its reply talk about the same thing."""
    return {slot: rng.choice(options) for slot, options in topic.slots.items()}


def user_filler(rng: random.Random, topic: Topic, values: dict[str, str]) -> tuple[str, str]:
    """A user message on the topic, and the gist the assistant will paraphrase."""
    ask, gist = rng.choice(topic.asks)
    parts = []
    if rng.random() < 0.3:
        parts.append(rng.choice(ANSWERS))  # answering the assistant's last question
    parts.append(_fill(ask, values))
    if rng.random() < 0.5:
        parts.append(rng.choice(topic.remarks))
    return " ".join(parts), gist.format(**values)


def assistant_filler(rng: random.Random, topic: Topic, values: dict[str, str], gist: str) -> str:
    """An assistant reply: paraphrase, two or three pieces of advice, a follow-up question."""
    # Two or three sentences of advice: assistants write more than users do.
    advice = rng.sample(topic.advice, k=rng.choice((2, 3)))
    parts = [rng.choice(OPENERS).format(gist=gist)]
    parts += [_fill(a, values) for a in advice]
    parts.append(_fill(rng.choice(topic.follow_ups), values))
    return " ".join(parts)


@dataclass
class _Plant:
    """What to say at one user slot instead of filler."""

    statement: str
    echo: str  # "": the assistant does not repeat it back
    lead: bool = True  # False: the statement opens the message itself


def _nearest_free(want: int, length: int, taken: set[int], *, below: int | None = None) -> int:
    """The free user slot (an even index) nearest to ``want``; only under ``below`` if set."""
    top = length - 2 if below is None else below - 2
    want = max(0, min(want - want % 2, top))
    for delta in range(0, length + 1, 2):
        for slot in (want - delta, want + delta):
            if 0 <= slot <= top and slot not in taken:
                taken.add(slot)
                return slot
    raise ValueError("conversation too short for the planted facts; raise --length")


def _draw_value(rng: random.Random, template: FactTemplate, used: set[str]) -> str:
    """A value (with its unit) no other fact of the conversation states: one right answer."""
    return _draw(rng, template.value, used, template.unit, template.statement)


def _draw(rng: random.Random, draw: Draw, used: set[str], unit: str = "", what: str = "") -> str:
    """A value not in ``used`` (then added to it)."""
    for _ in range(200):
        value = draw(rng) + unit
        if value not in used:
            used.add(value)
            return value
    raise ValueError(f"cannot draw a distinct value for {what!r}")


def plan_facts(
    rng: random.Random,
    length: int,
    depths: Sequence[float],
    paraphrased: bool = False,
    days: Sequence[date] | None = None,
) -> tuple[list[Fact], dict[int, _Plant]]:
    """Choose the facts and the user slots that state them.

    Each depth gets one fact of every kind, a few turns apart; the constraint comes last
    in its cluster so that its earlier, original value always fits before it. With
    ``days`` (the conversation's, for the hard mix) multi-hop and temporal facts are
    planted too, after the classic ones so that those are drawn as they always were.
    """
    templates = {kind: rng.sample(FACT_TEMPLATES[kind], k=len(depths)) for kind in KINDS}
    taken: set[int] = set()
    # A temporal probe names its day: no date value may read as one of the days.
    used: set[str] = {day_month(day) for day in days or ()}
    facts: list[Fact] = []
    plants: dict[int, _Plant] = {}
    originals: list[tuple[int, FactTemplate, Fact]] = []
    for d, depth in enumerate(depths):
        order = [*rng.sample(KINDS[:-1], k=len(KINDS) - 1), "constraint"]
        base = round(depth * length)
        for k, kind in enumerate(order):
            template = templates[kind][d]
            slot = _nearest_free(base + 4 * k, length, taken)
            expected = _draw_value(rng, template, used)
            # A change comes with its own lead ("actually, from now on ...").
            statement = template.changed or template.statement
            lead = slot > 0 and not template.changed
            plants[slot] = _Plant(
                statement.format(v=expected), template.echo.format(v=expected), lead
            )
            probe = template.paraphrase if paraphrased else template.probe
            fact = Fact(kind, probe, expected, slot, bucket_of(slot, length), depth)
            if kind == "constraint":
                originals.append((slot, template, fact))
            facts.append(fact)
    for slot, template, fact in originals:
        # The original value, stated some turns before it is changed.
        gap = rng.randint(max(2, length // 16), max(4, length // 8))
        old_slot = _nearest_free(slot - gap, length, taken, below=slot)
        old = _draw_value(rng, template, used)
        plants[old_slot] = _Plant(
            template.statement.format(v=old), template.echo.format(v=old), old_slot > 0
        )
        index = facts.index(fact)
        facts[index] = Fact(**{**asdict(fact), "old": old, "old_index": old_slot})
    if days is not None:
        _plan_hard(rng, length, depths, days, taken, used, facts, plants)
    return facts, plants


def _plan_hard(
    rng: random.Random,
    length: int,
    depths: Sequence[float],
    days: Sequence[date],
    taken: set[int],
    used: set[str],
    facts: list[Fact],
    plants: dict[int, _Plant],
) -> None:
    """The hard mix's probes: per depth, news told on that day (one per day: its probe
    must have one answer), and a multi-hop pair whose second half comes
    ``MULTI_HOP_GAP`` of the conversation later (none when that is past the end)."""
    temporal = rng.sample(TEMPORAL_TEMPLATES, k=len(depths))
    hops = rng.sample(MULTI_HOP_TEMPLATES, k=len(depths))
    told_on: set[int] = set()
    for d, depth in enumerate(depths):
        base = round(depth * length)
        slot = _nearest_free(base + 20, length, taken)
        day = day_of(slot, length)
        if day in told_on:
            taken.discard(slot)
        else:
            told_on.add(day)
            news = temporal[d]
            value = _draw(rng, news.value, used, what=news.statement)
            plants[slot] = _Plant(
                news.statement.format(v=value), news.echo.format(v=value), slot > 0
            )
            asks_when = rng.random() < 0.5
            probe = news.when if asks_when else news.what.format(day=day_label(days[day]))
            answer = day_month(days[day]) if asks_when else ""
            bucket = bucket_of(slot, length)
            facts.append(Fact("temporal", probe, value, slot, bucket, depth, answer=answer))
        if depth + MULTI_HOP_GAP >= 1:
            continue
        hop = hops[d]
        first = _nearest_free(base + 24, length, taken)
        second = _nearest_free(round((depth + MULTI_HOP_GAP) * length), length, taken)
        if second <= first:
            raise ValueError("conversation too short for the multi-hop facts; raise --length")
        value = _draw(rng, hop.value, used, what=hop.first)
        plants[first] = _Plant(hop.first.format(v=value), hop.echo.format(v=value), first > 0)
        plants[second] = _Plant(hop.second, "")
        bucket = bucket_of(first, length)
        facts.append(
            Fact(
                "multi-hop",
                hop.probe,
                value,
                first,
                bucket,
                depth,
                link=hop.link,
                link_index=second,
            )
        )


# --- Time: a conversation spread over days ----------------------------------------------

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def day_of(index: int, length: int) -> int:
    """The day (0 to DAYS - 1) of message ``index``: turns are spread evenly."""
    return (index // 2) * DAYS // (length // 2)


def day_label(day: date) -> str:
    """How a user names a day: "Tuesday 5 March"."""
    return f"{WEEKDAYS[day.weekday()]} {day_month(day)}"


def day_month(day: date) -> str:
    """The day as "5 March": what answers "when did I tell you …?"."""
    return f"{day.day} {MONTHS[day.month - 1]}"


def timeline(seed: int, number: int, length: int) -> tuple[tuple[float, ...], tuple[date, ...]]:
    """Each message's time (Unix seconds, UTC) and the conversation's days.

    From a ``Random`` of its own: the text does not depend on the times. The first day is
    in 2024; each day's messages run from about 8:00 to 19:00, a few minutes apart.
    """
    rng = random.Random(f"times-{seed}-{number}")
    first = date(2024, 3, 4) + timedelta(days=rng.randrange(240))
    days = tuple(first + timedelta(days=d) for d in range(DAYS))
    spacing = 10 * 3600 * DAYS / length  # mean seconds between messages of one day
    times: list[float] = []
    clock, today = 0.0, -1
    for index in range(length):
        day = day_of(index, length)
        if day != today:
            today = day
            morning = datetime(days[day].year, days[day].month, days[day].day, 8, tzinfo=UTC)
            clock = morning.timestamp() + rng.randrange(3600)
        else:
            clock += max(5, round(spacing * rng.uniform(0.3, 1.7)))
        times.append(clock)
    return tuple(times), days


def _fact_message(rng: random.Random, plant: _Plant, topic: Topic, values: dict[str, str]) -> str:
    lead = rng.choice(LEADS) if plant.lead else ""
    text = lead + plant.statement + "."
    text = text[0].upper() + text[1:]
    if rng.random() < 0.5:
        text += " " + _fill(rng.choice(topic.remarks), values)
    return text


def _fact_reply(rng: random.Random, plant: _Plant, topic: Topic, values: dict[str, str]) -> str:
    parts = [rng.choice(ACKS)]
    # Assistants often repeat a fact back, sometimes they don't (nor what has no echo).
    if plant.echo and rng.random() < 0.5:
        parts.append(f"I'll keep in mind: {plant.echo}.")
    parts.append(_fill(rng.choice(topic.follow_ups), values))
    return " ".join(parts)


def _clean(make: Callable[[], _T], text: Callable[[_T], str], forbidden: Sequence[str]) -> _T:
    """Filler that states no planted value, so a fact is only ever where it was planted."""
    for _ in range(50):
        made = make()
        if not any(mentions(text(made), value) for value in forbidden):
            return made
    raise ValueError("filler keeps colliding with a planted value")


def _first(pair: tuple[str, str]) -> str:
    return pair[0]


def _turn(
    rng: random.Random, topic: Topic, plant: _Plant | None, forbidden: Sequence[str]
) -> list[dict[str, str]]:
    """One user message and the assistant's reply: a planted fact, or filler."""
    values = _slot_values(rng, topic)
    if plant is not None:
        user = _fact_message(rng, plant, topic, values)
        reply = _fact_reply(rng, plant, topic, values)
    else:
        user, gist = _clean(lambda: user_filler(rng, topic, values), _first, forbidden)
        reply = _clean(lambda: assistant_filler(rng, topic, values, gist), str, forbidden)
    return [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


def _topic_schedule(rng: random.Random, length: int) -> list[Topic]:
    """The topic of each turn: segments of 8-20 turns, each a different topic."""
    per_turn: list[Topic] = []
    topic = rng.choice(TOPICS)
    while len(per_turn) < length // 2:
        per_turn += [topic] * rng.randint(8, 20)
        topic = rng.choice([t for t in TOPICS if t is not topic])
    return per_turn[: length // 2]


def generate(
    seed: int,
    number: int,
    length: int,
    depths: Sequence[float],
    paraphrased: bool = False,
    mix: str = "classic",
) -> Conversation:
    """One conversation of ``length`` alternating user/assistant messages, facts planted.

    ``paraphrased`` asks each probe without the statement's words; the conversation is
    the same either way. ``mix="hard"`` paraphrases every probe and plants multi-hop and
    temporal facts too (another conversation than the classic one of the same seed).
    """
    if mix not in MIXES:
        raise ValueError(f"unknown probe mix {mix!r} (known: {', '.join(MIXES)})")
    rng = random.Random(seed * 1_000_003 + number)
    times, days = timeline(seed, number, length)
    hard = mix == "hard"
    facts, plants = plan_facts(rng, length, depths, paraphrased or hard, days if hard else None)
    forbidden = [f.expected for f in facts] + [f.old for f in facts if f.old]
    forbidden += [f.link for f in facts if f.link] + [f.answer for f in facts if f.answer]
    messages: list[dict[str, str]] = []
    for turn, topic in enumerate(_topic_schedule(rng, length)):
        plant = plants.get(2 * turn)
        messages += _turn(rng, topic, plant, forbidden)
    conversation = Conversation(f"s{seed}-c{number}", tuple(messages), tuple(facts), times)
    check_planted(conversation)
    return conversation


def check_planted(conversation: Conversation) -> None:
    """Each answer is stated only where planted (and echoed), and no probe gives it away.

    A multi-hop link is said only in its second statement; a temporal "when" answer (a
    date) nowhere at all: only the message's time holds it.
    """
    for fact in conversation.facts:
        if mentions(fact.probe, fact.expected) or mentions(fact.probe, fact.right_answer):
            raise ValueError(f"the probe gives the answer away: {fact}")
        allowed = {fact.index, fact.index + 1, fact.old_index, fact.old_index + 1}
        for i, message in enumerate(conversation.messages):
            for value in (fact.expected, fact.old):
                if value and mentions(message["content"], value) and i not in allowed:
                    raise ValueError(f"message {i} states {value!r} of {fact}")
            if fact.link and mentions(message["content"], fact.link) and i != fact.link_index:
                raise ValueError(f"message {i} says the link {fact.link!r} of {fact}")
            if fact.answer and mentions(message["content"], fact.answer):
                raise ValueError(f"message {i} states the date {fact.answer!r} of {fact}")


def generate_all(
    seed: int,
    count: int,
    length: int,
    depths: Sequence[float],
    paraphrased: bool = False,
    mix: str = "classic",
) -> list[Conversation]:
    """The benchmark's conversations; the same arguments always give the same ones."""
    return [generate(seed, n, length, depths, paraphrased, mix) for n in range(count)]
