"""Write train.jsonl / eval.jsonl for the short-answers example: capital-city questions with their answer.

    python examples/short_answers/make_data.py            # writes next to this file

Every row has the prompt (a chat conversation, TRL's conversational format) and an `answer` column
that the reward function receives as a keyword argument. Train and eval countries are disjoint.
"""

import json
import random
from pathlib import Path

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "Canada": "Ottawa", "Australia": "Canberra",
    "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw", "Austria": "Vienna",
    "Hungary": "Budapest", "the Czech Republic": "Prague", "Belgium": "Brussels", "the Netherlands": "Amsterdam",
    "Switzerland": "Bern", "Turkey": "Ankara", "India": "New Delhi", "Thailand": "Bangkok",
    "South Korea": "Seoul", "Kenya": "Nairobi", "Argentina": "Buenos Aires", "Peru": "Lima", "Chile": "Santiago",
    "Mexico": "Mexico City", "Cuba": "Havana", "the United Kingdom": "London", "Iran": "Tehran",
    "Iraq": "Baghdad", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "the Philippines": "Manila",
    "Colombia": "Bogota", "Venezuela": "Caracas", "Ukraine": "Kyiv", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Morocco": "Rabat", "Nigeria": "Abuja",
    "Ethiopia": "Addis Ababa", "Saudi Arabia": "Riyadh", "Pakistan": "Islamabad", "Bangladesh": "Dhaka",
    "Nepal": "Kathmandu", "Iceland": "Reykjavik", "Scotland": "Edinburgh", "Wales": "Cardiff",
    "Brazil": "Brasilia", "Lebanon": "Beirut", "Syria": "Damascus", "Jordan": "Amman", "Qatar": "Doha",
    "Malaysia": "Kuala Lumpur", "Estonia": "Tallinn", "Latvia": "Riga", "Lithuania": "Vilnius",
    "Slovakia": "Bratislava", "Slovenia": "Ljubljana", "Albania": "Tirana", "Georgia": "Tbilisi",
    "Armenia": "Yerevan", "Kazakhstan": "Astana", "Mongolia": "Ulaanbaatar", "Afghanistan": "Kabul",
    "Sri Lanka": "Colombo", "New Zealand": "Wellington", "Ghana": "Accra", "Senegal": "Dakar",
    "Tunisia": "Tunis", "Algeria": "Algiers", "Libya": "Tripoli", "Sudan": "Khartoum", "Uganda": "Kampala",
    "Tanzania": "Dodoma", "Zimbabwe": "Harare", "Zambia": "Lusaka", "Angola": "Luanda", "Ecuador": "Quito",
    "Bolivia": "Sucre", "Paraguay": "Asuncion", "Uruguay": "Montevideo", "Panama": "Panama City",
    "Jamaica": "Kingston", "Costa Rica": "San Jose", "Honduras": "Tegucigalpa", "Nicaragua": "Managua",
}
SYSTEM = "Answer in at most three words."


def rows(countries: list[str]) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"What is the capital of {c}?"}],
             "answer": CAPITALS[c]} for c in countries]


def main() -> None:
    countries = sorted(CAPITALS)
    random.Random(0).shuffle(countries)
    split = len(countries) * 2 // 3
    out = Path(__file__).parent
    for name, part in (("train", countries[:split]), ("eval", countries[split:])):
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows(part))
        print(f"{out / name}.jsonl: {len(part)} questions")


if __name__ == "__main__":
    main()
